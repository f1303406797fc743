"""vLLM's behaviours that its clients rely on, through the real HTTP app
(``roundgate.deployment.app``'s routes, FastAPI and the error handlers) on a fake rank, no Ray: chat
``echo``, ``-1`` logprobs, lax scalars, any message role, vLLM's fields at their defaults,
``stream_options``, the ``prompt_logprobs`` key, echoed token ids, vLLM's answer keys and vLLM's
wording for the errors clients match on (its endpoints: ``test_vllm_endpoints.py``). docs/api.md
("What is accepted, coerced, refused") is the policy.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from vllm_http import MESSAGES, App, content, error

from roundgate.actors.control.request import DEFAULT_MAX_LOGPROBS as MAX_LOGPROBS
from roundgate.deployment.openai.field_policy import default_only
from roundgate.deployment.openai.protocol import ChatRequest, CompletionRequest

SAYING = "An apple a day, keeps"


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> App:
    return App(monkeypatch)


# ---- echo on chat completions (vLLM's extension) -------------------------------------------

CONTINUED = {
    "messages": [*MESSAGES, {"role": "assistant", "content": SAYING}],
    "add_generation_prompt": False,
    "continue_final_message": True,
    "max_tokens": 2,
}


@pytest.mark.parametrize("echo", [True, False])
def test_echo_with_continue_final_message_prepends_the_continued_turn(app, echo) -> None:
    status, body = app.post("/v1/chat/completions", **CONTINUED, echo=echo)
    message = body["choices"][0]["message"]
    assert status == 200 and message["role"] == "assistant"
    assert message["content"] == (SAYING + "ok" if echo else "ok")
    _, events = app.post("/v1/chat/completions", **CONTINUED, echo=echo, stream=True)
    assert content(events) == message["content"]  # streamed: in the first chunk


def test_echo_after_a_generation_prompt_echoes_nothing(app) -> None:
    # vLLM echoes the last message only when it has the answer's role (here the user's is last)
    status, body = app.chat(echo=True, max_tokens=2)
    assert status == 200 and body["choices"][0]["message"]["content"] == "ok"


# ---- -1: the whole vocabulary, bounded as vLLM bounds it ---------------------------------


@pytest.mark.parametrize(
    ("path", "fields", "param", "what"),
    [
        ("/v1/chat/completions", {"prompt_logprobs": -1}, "prompt_logprobs", "prompt"),
        (
            "/v1/chat/completions",
            {"top_logprobs": -1, "logprobs": "true"},
            "top_logprobs",
            "sample",
        ),
        ("/v1/completions", {"logprobs": -1}, "logprobs", "sample"),
        ("/v1/completions", {"prompt_logprobs": -1}, "prompt_logprobs", "prompt"),
    ],
)
def test_minus_one_past_the_server_s_maximum_is_vllm_s_refusal(app, path, fields, param, what):
    # vLLM at its default --max-logprobs (20) refuses a vocabulary larger than that alike
    base = {"messages": MESSAGES} if "chat" in path else {"prompt": "ab"}
    status, got, message = error(app.post(path, **base, **fields))
    vocab = app.core.vocab_size
    assert (status, got) == (400, param)
    assert message == (
        f"Requested {what} logprobs of {vocab}, which is greater than max allowed: {MAX_LOGPROBS}"
    )
    assert app.sent == []


def test_minus_one_within_the_maximum_is_the_whole_vocabulary(app) -> None:
    app.core.vocab_size = 16  # a vocabulary the rank can report whole
    app.core.eos_token_ids = ()  # the byte tokenizer's EOS (257) lies outside it
    status, body = app.complete(prompt=[1, 2, 3], prompt_logprobs=-1, logprobs=-1, max_tokens=1)
    assert status == 200 and body["choices"][0]["prompt_logprobs"][0] is None
    sampling = app.sent[-1].sampling
    assert (sampling.prompt_logprobs, sampling.logprobs) == (16, 16)


def with_max_logprobs(app, limit: int) -> None:
    app.core.app_args = app.core.app_args.model_copy(update={"max_logprobs": limit})


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_max_logprobs_is_the_deployment_s_bound_as_vllm_s_flag(app, path: str) -> None:
    """``max_logprobs`` moves the bound both ways: 25 passes at 30, 31 is vLLM's refusal
    naming 30, and -1 lets the whole vocabulary through (vLLM's ``--max-logprobs -1``)."""
    chat = "chat" in path
    base = {"messages": MESSAGES, "logprobs": True} if chat else {"prompt": "ab"}
    field = "top_logprobs" if chat else "logprobs"
    with_max_logprobs(app, 30)
    assert app.post(path, **base, **{field: 25}, max_tokens=1)[0] == 200
    assert app.sent[-1].sampling.logprobs == 25
    status, param, message = error(app.post(path, **base, **{field: 31}, max_tokens=1))
    assert (status, param) == (400, field)
    assert message == "Requested sample logprobs of 31, which is greater than max allowed: 30"
    with_max_logprobs(app, -1)
    assert app.post(path, **base, **{field: -1}, max_tokens=1)[0] == 200
    assert app.sent[-1].sampling.logprobs == app.core.vocab_size


def test_max_logprobs_below_minus_one_is_refused_by_name() -> None:
    from roundgate.deployment.config import AppArgs

    with pytest.raises(ValueError, match="max_logprobs"):
        AppArgs.model_validate({"model": "tiny-moe", "max_logprobs": -2})


def test_top_logprobs_rules_are_vllm_s(app) -> None:
    assert app.chat(top_logprobs=0, max_tokens=1)[0] == 200  # 0 asks for nothing
    status, param, message = error(app.chat(top_logprobs=-1, max_tokens=1))
    assert (status, param) == (400, "top_logprobs") and "`logprobs` must be set to true" in message
    status, param, message = error(app.chat(top_logprobs=-2, logprobs=True))
    assert (status, param) == (400, "top_logprobs") and "greater_than_equal" in message


# ---- lax scalars ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"logprobs": "true"},
        {"max_tokens": "2"},
        {"temperature": "0.5"},
        {"stream": "false"},
        {"n": "1"},
        {"seed": "7"},
        {"max_tokens": 2.0},
        {"temperature": None, "top_p": None, "n": None, "stream": None, "ignore_eos": None},
    ],
)
def test_scalars_are_coerced_as_vllm_s_models_coerce_them(app, fields) -> None:
    assert app.chat(**fields)[0] == 200


def test_null_means_the_default(app) -> None:
    # the model's generation_config.json defaults apply, as when the field is left out
    app.chat(max_tokens=1)
    app.chat(max_tokens=1, temperature=None, top_p=None, top_k=None)
    left_out, null = app.sent[-2].sampling, app.sent[-1].sampling
    assert (null.temperature, null.top_p, null.top_k) == (
        left_out.temperature,
        left_out.top_p,
        left_out.top_k,
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"logprobs": "maybe"}, "logprobs"),
        ({"n": "x"}, "n"),
        ({"max_tokens": True}, "max_tokens"),  # stricter than vLLM: a boolean is no count
    ],
)
def test_values_lost_in_a_coercion_are_still_refused(app, fields, param) -> None:
    assert error(app.chat(**fields))[:2] == (400, param)


# ---- custom roles --------------------------------------------------------------------------


def test_any_role_reaches_the_template_as_sent(app) -> None:
    messages = [{"role": "narrator", "content": "once"}, *MESSAGES]
    status, _ = app.post("/v1/chat/completions", messages=messages, max_tokens=1)
    assert status == 200 and b"<|narrator|>\nonce" in bytes(app.sent[-1].prompt_token_ids)


def test_the_answer_has_the_continued_message_s_role(app) -> None:
    messages = [{"role": "narrator", "content": "once upon"}]
    status, body = app.post(
        "/v1/chat/completions", messages=messages, add_generation_prompt=False, max_tokens=1
    )
    assert status == 200 and body["choices"][0]["message"]["role"] == "narrator"


# ---- vLLM's fields at their do-nothing values ----------------------------------------------

# A value of each vLLM default-only field that would change the output.
ASKING = {
    "early_stopping": True,
    "watermarking": True,
    "allowed_token_ids": [1, 2],
    "bad_words": ["x"],
    "priority": 1,
    "cache_salt": "salt",
    "logprob_token_ids": [1],
    "kv_transfer_params": {"do_remote_decode": True},
    "vllm_xargs": {"k": 1},
    "repetition_detection": {"max_pattern_size": 4},
    "stream_interval": 4,
    "prompt_embeds": "AAAA",
    "add_special_tokens": "flip",  # replaced by the opposite of the endpoint's default
    "documents": [{"title": "t", "text": "x"}],
    "chat_template": "{{ messages }}",
    "mm_processor_kwargs": {"a": 1},
    "media_io_kwargs": {"image": {}},
    "include_reasoning": False,
    "thinking_token_budget": 10,
}
CASES = [
    (model, name, values)
    for model in (CompletionRequest, ChatRequest)
    for name, values in default_only(model).items()
]


def _send(app: App, model: type, **fields: Any) -> tuple[int, Any]:
    return app.complete(**fields) if model is CompletionRequest else app.chat(**fields)


@pytest.mark.parametrize(
    ("model", "name", "values"), CASES, ids=lambda x: getattr(x, "__name__", x)
)
def test_vllm_fields_at_their_defaults_are_accepted_and_others_refused(
    app, model, name, values
) -> None:
    for value in values:
        if name == "prompt_embeds":  # vLLM's shape: no prompt text, embeddings instead
            continue
        assert _send(app, model, **{name: value}, max_tokens=1)[0] == 200, (name, value)
    asking = ASKING[name]
    if asking == "flip":
        asking = not next(v for v in values if v is not None)
    status, param, message = error(_send(app, model, **{name: asking}))
    assert (status, param) == (400, name) and "would change the output" in message


def test_every_default_only_field_is_marked_in_the_openapi_document() -> None:
    import roundgate.deployment.app  # noqa: F401  (the routes put the body models in the document)
    from roundgate.deployment.openai.api import api

    schemas = api.openapi()["components"]["schemas"]
    for model, name, values in CASES:
        prop = schemas[model.__name__]["properties"][name]
        assert prop["x-roundgate-supported"] == "default only"
        assert prop["x-roundgate-accepts"] == values


# ---- stream_options ------------------------------------------------------------------------


def test_stream_options_keys_vllm_added_are_accepted(app) -> None:
    options = {"include_usage": True, "min_characters": 5, "include_obfuscation": False}
    status, events = app.chat(stream=True, max_tokens=2, stream_options=options)
    assert status == 200 and events[-1]["usage"]["completion_tokens"] == 2
    # vLLM's test sends min_characters at the top level; neither API defines it
    options = {"include_usage": False}
    status, events = app.chat(stream=True, max_tokens=2, min_characters=10, stream_options=options)
    assert status == 200 and all(
        isinstance(e["choices"][0]["delta"]["content"], str) for e in events
    )


def test_continuous_usage_stats_without_include_usage_streams_no_usage(app) -> None:
    # vLLM: continuous usage rides on include_usage; alone it is accepted and adds nothing
    options = {"continuous_usage_stats": True}
    status, events = app.chat(stream=True, max_tokens=2, stream_options=options)
    assert status == 200 and all("usage" not in e for e in events)
    assert app.chat(stream_options={}, max_tokens=1)[0] == 200  # empty options, no stream
    status, param, message = error(app.chat(stream_options={"include_usage": True}))
    assert (status, param) == (400, "stream_options") and "`stream=True`" in message


# ---- the prompt_logprobs key and echoed token ids ------------------------------------------


def test_prompt_logprobs_is_null_when_not_asked_for(app) -> None:
    _, body = app.complete(max_tokens=1)
    assert "prompt_logprobs" in body["choices"][0] and body["choices"][0]["prompt_logprobs"] is None
    _, body = app.chat(max_tokens=1)
    assert "prompt_logprobs" in body and body["prompt_logprobs"] is None


def test_echo_of_token_ids_is_their_text_with_special_tokens_kept(app, monkeypatch) -> None:
    calls = []
    decode = app.core.tokenizer.decode

    def spy(ids, skip_special_tokens=True):
        calls.append(skip_special_tokens)
        return decode(ids, skip_special_tokens)

    monkeypatch.setattr(app.core.tokenizer, "decode", spy)
    status, body = app.complete(prompt=[104, 105], echo=True, max_tokens=2)
    assert status == 200 and body["choices"][0]["text"] == "hiok"
    assert False in calls  # the echo kept special tokens, as vLLM's decode does
    _, events = app.complete(prompt=[104, 105], echo=True, max_tokens=2, stream=True)
    assert "".join(e["choices"][0]["text"] for e in events) == "hiok"


# ---- vLLM's answer keys: token ids, fingerprints, tokens as ids -----------------------------


def test_token_id_keys_are_always_there_and_null_unless_asked(app) -> None:
    _, body = app.complete(max_tokens=1)
    choice = body["choices"][0]
    assert (choice["prompt_token_ids"], choice["token_ids"]) == (None, None)
    assert body["system_fingerprint"] is None
    _, body = app.chat(max_tokens=1)
    assert body["prompt_token_ids"] is None and body["choices"][0]["token_ids"] is None
    assert (body["system_fingerprint"], body["service_tier"]) == (None, None)
    message = body["choices"][0]["message"]
    assert {
        k: message[k] for k in ("refusal", "annotations", "audio", "function_call")
    } == dict.fromkeys(("refusal", "annotations", "audio", "function_call"))
    assert message["tool_calls"] == []  # vLLM's default when there are no calls


def test_chat_answer_has_every_key_of_the_sdk_s_chat_completion(app) -> None:
    """vLLM's ``test_invocations`` compares the SDK's ``model_dump()`` keys with the raw
    JSON's: every field of the installed SDK's ``ChatCompletion`` is in the answer."""
    from openai.types.chat import ChatCompletion

    _, body = app.chat(max_tokens=1)
    assert set(ChatCompletion.model_fields) <= set(body)
    # vLLM's test_invocations: the SDK's dump of the choices equals the raw JSON's.
    assert ChatCompletion.model_validate(body).model_dump()["choices"] == body["choices"]
    assert (body["metadata"], body["moderation"]) == (None, None)


def test_chat_return_token_ids_put_the_prompt_s_at_the_top(app) -> None:
    _, body = app.chat(max_tokens=2, return_token_ids=True)
    prompt_ids = list(app.sent[-1].prompt_token_ids)
    assert body["prompt_token_ids"] == prompt_ids and body["choices"][0]["token_ids"] == [111, 107]
    _, events = app.chat(max_tokens=2, return_token_ids=True, stream=True)
    assert events[0]["prompt_token_ids"] == prompt_ids  # the stream's first chunk only
    assert all("prompt_token_ids" not in e for e in events[1:])


def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(app) -> None:
    _, body = app.complete(max_tokens=2, logprobs=1, return_tokens_as_token_ids=True)
    assert body["choices"][0]["logprobs"]["tokens"] == ["token_id:111", "token_id:107"]
    _, body = app.chat(max_tokens=1, logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True)
    entry = body["choices"][0]["logprobs"]["content"][0]
    assert entry["token"] == "token_id:111" and entry["top_logprobs"][0]["token"] == "token_id:111"


def test_tokenize_token_strs_are_vocabulary_pieces(app, monkeypatch) -> None:
    pieces = SimpleNamespace(convert_ids_to_tokens=lambda ids: [f"piece{i}" for i in ids])
    monkeypatch.setattr(app.core.tokenizer, "_tok", pieces, raising=False)
    status, body = app.post("/tokenize", prompt="ab", return_token_strs=True)
    assert status == 200 and body["token_strs"] == ["piece97", "piece98"]


# ---- vLLM's wording for the errors clients match on ----------------------------------------


@pytest.mark.parametrize("prompt", ["", [], [[]], None])
def test_an_empty_prompt_is_refused_in_vllm_s_words(app, prompt) -> None:
    status, param, message = error(app.complete(prompt=prompt))
    assert (status, param) == (400, "prompt")
    assert message == "Either prompt or prompt_embeds must be provided and non-empty."


def test_an_out_of_vocabulary_id_is_refused_in_vllm_s_words(app) -> None:
    status, param, message = error(app.complete(prompt=[999999]))
    assert (status, param) == (400, "prompt") and "Token id 999999 is out of vocabulary" in message


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"seed": 2**63}, "less_than_equal"),
        ({"seed": -(2**63) - 1}, "greater_than_equal"),
        ({"max_tokens": -1}, "greater_than_equal"),
        ({"temperature": 3}, "less_than_equal"),
    ],
)
def test_an_out_of_range_number_names_pydantic_s_error_type(app, fields, kind) -> None:
    status, param, message = error(app.complete(**fields))
    assert (status, param) == (400, next(iter(fields))) and f"[type={kind}]" in message
