"""``/tokenize`` and ``/detokenize`` on the ingress (vLLM's shapes): the ids are the ones
generation uses, for a prompt and for chat messages; bad input is a 400 naming the field."""

from __future__ import annotations

import pytest
from ingress_fakes import error_of, make_ingress

from roundgate.deployment.openai.completions import prompt_ids
from roundgate.deployment.openai.protocol import CompletionRequest, parse
from roundgate.deployment.openai.tokenization import (
    DetokenizeRequest,
    TokenizeRequest,
    detokenize,
    tokenize,
)


@pytest.fixture(scope="module")
def core():
    return make_ingress()[0]


def test_a_prompt_tokenizes_as_completions_would(core) -> None:
    out = tokenize(core, parse(TokenizeRequest, {"prompt": "héllo", "return_token_strs": True}))
    ids = prompt_ids(parse(CompletionRequest, {"prompt": "héllo"}), core.tokenizer)[0]
    assert out["tokens"] == ids and out["count"] == len(ids)
    assert out["max_model_len"] == core.max_model_len
    assert "".join(out["token_strs"]).replace("\ufffd", "") == "hllo"  # é is two byte tokens
    assert detokenize(core, parse(DetokenizeRequest, {"tokens": ids})) == {"prompt": "héllo"}


def test_messages_tokenize_as_chat_would(core) -> None:
    messages = [{"role": "user", "content": "hi"}]
    out = tokenize(core, parse(TokenizeRequest, {"messages": messages}))
    assert out["tokens"] == core.tokenizer.render_chat(messages)
    assert out["token_strs"] is None


def test_messages_tokenize_with_chat_s_rendering_fields(core) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    body = {"messages": messages, "add_generation_prompt": False}
    closed = tokenize(core, parse(TokenizeRequest, body))["tokens"]
    body["continue_final_message"] = True
    continued = tokenize(core, parse(TokenizeRequest, body))["tokens"]
    assert bytes(closed).endswith(b"ok\n") and bytes(continued).endswith(b"ok")
    # Keys a client's SDK adds to a message are ignored, as by the chat route.
    tagged = [{**m, "sdk_id": 7} for m in messages]
    assert (
        tokenize(core, parse(TokenizeRequest, {"messages": tagged}))["tokens"]
        == (tokenize(core, parse(TokenizeRequest, {"messages": messages}))["tokens"])
    )


@pytest.mark.parametrize(
    ("model", "body", "param"),
    [
        (TokenizeRequest, {}, "prompt"),
        (
            TokenizeRequest,
            {"prompt": "a", "messages": [{"role": "user", "content": "a"}]},
            "messages",
        ),
        (
            TokenizeRequest,
            {"messages": [{"role": "user", "content": "a"}], "continue_final_message": True},
            "continue_final_message",
        ),
        (
            TokenizeRequest,
            {"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"tools": 1}},
            "chat_template_kwargs",
        ),
        (TokenizeRequest, {"prompt": "a", "extra": 1}, "extra"),
        (DetokenizeRequest, {"tokens": [600]}, "tokens"),
        (DetokenizeRequest, {"tokens": ["a"]}, "tokens"),
    ],
)
def test_bad_requests_name_the_field(core, model, body, param) -> None:
    fn = tokenize if model is TokenizeRequest else detokenize
    exc = error_of(lambda: fn(core, parse(model, body)))
    assert (exc.status, exc.param) == (400, param)
