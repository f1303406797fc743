"""The API contract real clients rely on, on the ingress with a fake rank (no Ray): prompt
logprobs in OpenAI's ``echo`` shape and vLLM's ``prompt_logprobs`` shape, scoring with
``max_tokens: 0``, vLLM's request extensions, and where the surface is lenient or strict.

The fake rank answers like a real one: prompt logprobs (made-up numbers, one entry per prompt
token from the second on) on the first chunk when the request asks for them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from ingress_fakes import error_of, make_ingress, make_request, tokens

from roundgate.actors.control.messages import GenerateChunk, GenerateRequest, Usage
from roundgate.actors.control.request import TokenLogprobs
from roundgate.deployment.openai.chat import create_chat_completion
from roundgate.deployment.openai.completions import create_completion
from roundgate.deployment.openai.models import server_version
from roundgate.deployment.openai.tokenization import tokenizer_info


def fake_logprobs(i: int, k: int) -> TokenLogprobs:
    """Prompt token ``i``'s made-up entry: its rank is ``i % 3 + 1``, the top k are 1..k."""
    tops = tuple(range(1, k + 1))
    return TokenLogprobs(-0.25 * i, tops, tuple(-0.1 * j for j in tops), i % 3 + 1)


def scoring_reply(message: GenerateRequest) -> list[Any]:
    """Two tokens ('o', 'k'), with prompt and output logprobs when asked."""
    sampling = message.sampling
    prompt = len(message.prompt_token_ids)
    k = sampling.prompt_logprobs
    prompt_lps = None if k is None else tuple(fake_logprobs(i, k) for i in range(1, prompt))
    out_lps = None
    if sampling.logprobs is not None:
        out_lps = (TokenLogprobs(-1.0, (111,), (-1.0,)),)
    n = min(sampling.max_tokens, 2)
    chunks = [
        GenerateChunk(
            token_ids=(111,),
            finish_reason=None if n > 1 else "length",
            usage=Usage(prompt_tokens=prompt, completion_tokens=1),
            error=None,
            logprobs=out_lps,
            index=0,
            error_status=400,
            prompt_logprobs=prompt_lps,
        )
    ]
    if n > 1:
        chunks.append(
            GenerateChunk(
                token_ids=(107,),
                finish_reason="length",
                usage=Usage(prompt_tokens=prompt, completion_tokens=2),
                error=None,
                logprobs=out_lps,
            )
        )
    return chunks


def call(route: Any, reply: Any = scoring_reply, **body: Any) -> Any:
    """Run ``route`` on ``body``: the JSON answer, or a streamed answer's events."""
    core, _ = make_ingress(reply)

    async def run() -> Any:
        out = await route(core, make_request(json.dumps(body).encode()))
        if isinstance(out, dict):
            return out
        events = [part async for part in out.body_iterator]
        lines = [e[len("data: ") :].strip() for e in events]
        return [json.loads(x) for x in lines if x != "[DONE]"]

    return asyncio.run(run())


# ---- prompt logprobs ---------------------------------------------------------------------


def test_echo_with_logprobs_reports_every_prompt_token_first_null() -> None:
    out = call(create_completion, prompt="abc", echo=True, logprobs=1, max_tokens=2)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == "abcok"
    assert lp["tokens"] == ["a", "b", "c", "o", "k"]
    assert lp["token_logprobs"][:3] == [None, -0.25, -0.5]
    assert lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][1] == {"\x01": -0.1, "b": -0.25}  # top 1, plus the token itself
    assert lp["text_offset"] == [0, 1, 2, 3, 4]


def test_echo_with_logprobs_streams_the_prompt_part_in_the_first_chunk() -> None:
    events = call(create_completion, prompt="abc", echo=True, logprobs=0, max_tokens=2, stream=True)
    first = events[0]["choices"][0]
    assert first["text"] == "abco"
    assert first["logprobs"]["token_logprobs"] == [None, -0.25, -0.5, -1.0]
    assert events[1]["choices"][0]["logprobs"]["tokens"] == ["k"]


def test_max_tokens_zero_with_echo_scores_the_prompt_only() -> None:
    out = call(create_completion, prompt="abc", echo=True, logprobs=0, max_tokens=0)
    choice = out["choices"][0]
    assert choice["text"] == "abc" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["a", "b", "c"]
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}


def test_prompt_logprobs_in_vllm_s_shape_on_completions_and_chat() -> None:
    out = call(create_completion, prompt="ab", prompt_logprobs=2, max_tokens=1)
    first, second = out["choices"][0]["prompt_logprobs"]
    assert first is None
    assert second == {
        "98": {"logprob": -0.25, "rank": 2, "decoded_token": "b"},
        "1": {"logprob": -0.1, "rank": 1, "decoded_token": "\x01"},
        "2": {"logprob": -0.2, "rank": 2, "decoded_token": "\x02"},
    }
    chat = call(
        create_chat_completion,
        messages=[{"role": "user", "content": "hi"}],
        prompt_logprobs=0,
        max_tokens=1,
    )
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) > 2
    assert all(len(e) == 1 for e in chat["prompt_logprobs"][1:])  # k=0: the token alone


# ---- bad input: a 400 naming the field ---------------------------------------------------

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (create_completion, {"prompt": "a", "prompt_logprobs": 21}, "prompt_logprobs"),
        (create_chat_completion, {"messages": MESSAGES, "prompt_logprobs": 21}, "prompt_logprobs"),
        (
            create_completion,
            {"prompt": "a", "prompt_logprobs": 1, "stream": True},
            "prompt_logprobs",
        ),
        (create_completion, {"prompt": "a", "max_tokens": 0}, "max_tokens"),
        (create_completion, {"prompt": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        (create_completion, {"prompt": "a", "seed": 2**63}, "seed"),
        (create_completion, {"prompt": "a", "seed": -(2**63) - 1}, "seed"),
        (create_completion, {"prompt": "a", "frobnicate": 1}, "frobnicate"),
        # stream_options {} without stream, and continuous_usage_stats without include_usage,
        # are accepted as vLLM accepts them (tests/test_vllm_compat.py)
        (
            create_chat_completion,
            {"messages": MESSAGES, "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        (
            create_chat_completion,
            {
                "messages": MESSAGES,
                "response_format": {"type": "json_object", "json_schema": {"schema": {}}},
            },
            "response_format",
        ),
        (
            create_completion,
            {"prompt": "a", "structured_outputs": {"grammar": 'root ::= "a" |'}},
            "structured_outputs",
        ),
        (
            create_completion,
            {"prompt": "a", "structured_outputs": {"regex": "a", "choice": ["a"]}},
            "structured_outputs",
        ),
        (
            create_completion,
            {"prompt": "a", "structured_outputs": {"whitespace": "x"}},
            "structured_outputs",
        ),
        (
            create_chat_completion,
            {"messages": MESSAGES, "continue_final_message": True},
            "continue_final_message",
        ),
        (
            create_chat_completion,
            {"messages": MESSAGES, "chat_template_kwargs": {"tools": []}},
            "chat_template_kwargs",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field(route, body, param) -> None:
    exc = error_of(lambda: call(route, **body))
    assert (exc.status, exc.param) == (400, param), exc.message


def test_every_bad_logit_bias_key_is_named() -> None:
    exc = error_of(lambda: call(create_completion, prompt="a", logit_bias={"x": 1, "5": 1, "y": 2}))
    assert exc.param == "logit_bias"
    assert "'x'" in exc.message and "'y'" in exc.message and "'5'" not in exc.message


# ---- leniency --------------------------------------------------------------------------


def test_unknown_keys_inside_messages_and_parallel_tool_calls_false_are_accepted() -> None:
    messages = [{"role": "user", "content": "hi", "x-sdk-tag": {"a": 1}}]
    out = call(create_chat_completion, messages=messages, parallel_tool_calls=False, max_tokens=1)
    assert out["choices"][0]["message"]["content"] == "o"


# ---- vLLM's request extensions -----------------------------------------------------------


def payload_of(route: Any, **body: Any) -> GenerateRequest:
    core, ranks = make_ingress(scoring_reply)

    async def run() -> None:
        out = await route(core, make_request(json.dumps(body).encode()))
        if not isinstance(out, dict):
            async for _ in out.body_iterator:
                pass

    asyncio.run(run())
    return ranks.payloads[0]


@pytest.mark.parametrize(
    ("structured", "grammar"),
    [
        ({"json": {"type": "object"}}, ("json_schema", '{"type":"object"}')),
        ({"json": '{"type": "object"}'}, ("json_schema", '{"type":"object"}')),
        ({"regex": "[ab]+"}, ("regex", "[ab]+")),
        ({"choice": ["yes", "no"]}, ("choice", '["yes", "no"]')),
        ({"grammar": 'root ::= "x"'}, ("ebnf", 'root ::= "x"')),
        ({"json_object": True}, ("json_object", "")),
    ],
)
def test_structured_outputs_become_the_rank_s_grammar(structured, grammar) -> None:
    message = payload_of(create_completion, prompt="a", structured_outputs=structured)
    assert message.sampling.grammar == grammar


@pytest.mark.parametrize(
    ("strict", "kind"), [(True, "json_schema"), (None, "json_schema"), (False, "json_schema_open")]
)
def test_json_schema_strict_picks_the_grammar_s_rule(strict, kind) -> None:
    schema = {"name": "x", "schema": {"type": "object"}, "strict": strict}
    fmt = {"type": "json_schema", "json_schema": schema}
    message = payload_of(create_chat_completion, messages=MESSAGES, response_format=fmt)
    assert message.sampling.grammar is not None and message.sampling.grammar[0] == kind


@pytest.mark.parametrize(("side", "kept"), [("left", [99, 100]), ("right", [97, 98])])
def test_truncate_prompt_tokens_keeps_the_side_asked_for(side, kept) -> None:
    message = payload_of(
        create_completion, prompt="abcd", truncate_prompt_tokens=2, truncation_side=side
    )
    assert list(message.prompt_token_ids) == kept
    assert payload_of(
        create_completion, prompt="ab", truncate_prompt_tokens=5
    ).prompt_token_ids == (
        97,
        98,
    )


def test_tool_choice_none_renders_no_tools() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    plain = payload_of(create_chat_completion, messages=MESSAGES)
    # The byte tokenizer's transcript template refuses tools; with "none" they never reach it.
    message = payload_of(
        create_chat_completion, messages=MESSAGES, tools=[tool], tool_choice="none"
    )
    assert message.prompt_token_ids == plain.prompt_token_ids


def test_add_generation_prompt_and_continue_final_message_change_the_rendering() -> None:
    turns = [*MESSAGES, {"role": "assistant", "content": "ok"}]
    opened = payload_of(create_chat_completion, messages=turns).prompt_token_ids
    closed = payload_of(
        create_chat_completion, messages=turns, add_generation_prompt=False
    ).prompt_token_ids
    continued = payload_of(
        create_chat_completion,
        messages=turns,
        add_generation_prompt=False,
        continue_final_message=True,
    ).prompt_token_ids
    assert bytes(opened).endswith(b"ok\n<|assistant|>\n")
    assert bytes(closed).endswith(b"ok\n") and bytes(continued).endswith(b"ok")


def reply_with_stop(message: GenerateRequest) -> list[Any]:
    prompt = len(message.prompt_token_ids)
    return [tokens(*b"say END now", finish="length", prompt=prompt)]


@pytest.mark.parametrize(("include", "text"), [(False, "say "), (True, "say END")])
def test_include_stop_str_in_output(include, text) -> None:
    out = call(
        create_completion,
        reply_with_stop,
        prompt="a",
        stop=["END"],
        include_stop_str_in_output=include,
    )
    assert out["choices"][0]["text"] == text and out["choices"][0]["finish_reason"] == "stop"


def test_continuous_usage_stats_and_streamed_prompt_token_ids() -> None:
    events = call(
        create_chat_completion,
        messages=MESSAGES,
        max_tokens=2,
        stream=True,
        return_token_ids=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    chunks = [e for e in events if e["choices"]]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2]
    first, second = (c["choices"][0] for c in chunks)
    assert first["prompt_token_ids"] and first["token_ids"] == [111]
    assert "prompt_token_ids" not in second and second["token_ids"] == [107]
    completion = call(
        create_completion, prompt="ab", max_tokens=2, stream=True, return_token_ids=True
    )
    assert completion[0]["choices"][0]["prompt_token_ids"] == [97, 98]


# ---- endpoints -----------------------------------------------------------------------------


def test_version_and_tokenizer_info() -> None:
    assert set(server_version()) == {"version"}
    core, _ = make_ingress()
    info = tokenizer_info(core)
    assert info["tokenizer_class"] == "ByteTokenizer"
    assert info["model_max_length"] == core.max_model_len
    assert "eos_token" in info  # lm-evaluation-harness checks for it
    json.dumps(info)  # every value is JSON
