"""The ingress without Ray: request parsing, error bodies, edge validation, the 503 window.

A fake rank handle stands in for the Serve deployment, so the logic behind every 4xx and the
503-with-Retry-After of a failed group is checked in milliseconds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from starlette.requests import Request

from actors.control.messages import GenerateChunk, GenerateRequest, Usage
from actors.control.request import SamplingParams
from deployment import http_api, ingress
from deployment.choices import usage
from deployment.generation import Choice
from deployment.http_api import read_json
from deployment.ingress import Ingress
from deployment.protocol import (
    APIError,
    ChatRequest,
    CompletionRequest,
    describe_error,
    parse,
)

APP_ARGS = {"model": "tiny-moe", "dp_size": 2, "max_num_seqs": 4, "device": "cpu"}
CONTEXT = 4096  # tiny-moe's max_position


# ---- builders ----------------------------------------------------------------------------


class FakeStream:
    """What ``handle.options(stream=True).generate.remote`` returns: chunks, then the end."""

    def __init__(self, chunks: list[Any]) -> None:
        self.chunks = chunks
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[GenerateChunk]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[GenerateChunk]:
        for chunk in self.chunks:
            await asyncio.sleep(0)
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk

    def cancel(self) -> None:
        self.cancelled = True


class FakeRanks:
    """A rank handle whose ``generate`` answers from ``reply(message) -> chunks``."""

    def __init__(self, reply: Callable[[GenerateRequest], list[Any]]) -> None:
        self.reply = reply
        self.payloads: list[GenerateRequest] = []
        self.streams: list[FakeStream] = []

    def options(self, **_: Any) -> FakeRanks:
        return self

    @property
    def generate(self) -> FakeRanks:
        return self

    def remote(self, message: GenerateRequest) -> FakeStream:
        assert isinstance(message, GenerateRequest)
        self.payloads.append(message)
        self.streams.append(FakeStream(self.reply(message)))
        return self.streams[-1]


def tokens(*ids: int, finish: str | None = None, prompt: int = 1, done: int = 0) -> GenerateChunk:
    """A rank's chunk: ``ids`` after ``done`` earlier tokens of a ``prompt``-token sequence."""
    return GenerateChunk(tuple(ids), finish, Usage(prompt, done + len(ids)))


def echo_reply(message: GenerateRequest) -> list[Any]:
    """Greets back with the prompt's first byte, then ``max_tokens - 1`` more 'a's."""
    n = message.sampling.max_tokens
    first, prompt = message.prompt_token_ids[0], len(message.prompt_token_ids)
    return [
        tokens(first, prompt=prompt),
        *[tokens(97, prompt=prompt, done=i) for i in range(1, n - 1)],
        tokens(97, finish="length", prompt=prompt, done=n - 1),
    ]


def make_ingress(reply: Callable = echo_reply, **args: Any) -> tuple[Ingress, FakeRanks]:
    ranks = FakeRanks(reply)
    return Ingress(ranks, {**APP_ARGS, **args}), ranks


def make_request(body: bytes, headers: dict[str, str] | None = None) -> Request:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": raw}
    return Request(scope, receive)


def complete(core: Ingress, request_id: str = "req-1", **body: Any) -> tuple[list, list]:
    """Run a completion through the ingress: (choices, deltas)."""

    async def run() -> tuple[list, list]:
        req = parse(CompletionRequest, body)
        prompts = core.prompts_of(req)
        choices, stream = await core.generate(request_id, prompts, req, req.max_tokens, "prompt")
        return choices, [d async for d in stream]

    return asyncio.run(run())


def error_of(fn: Callable[[], Any]) -> APIError:
    with pytest.raises(APIError) as info:
        fn()
    return info.value


# ---- bodies and types ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status", "code", "fragment"),
    [
        (b'{"prompt": "hi"', 400, None, "invalid JSON"),
        (b"\xff\xfe{}", 400, None, "not UTF-8"),
        (b'{"prompt": "\xc3\x28"}', 400, None, "not UTF-8"),
        (b"x" * 2048, 413, "body_too_large", "exceeds 1024 bytes"),
        (b"[" * 100_000 + b"]" * 100_000, 400, None, "nested too deeply"),
    ],
    ids=["truncated", "utf16", "bad-utf8", "too-large", "deep"],
)
def test_unreadable_bodies_are_4xx(raw: bytes, status: int, code: str | None, fragment: str):
    exc = error_of(lambda: asyncio.run(read_json(make_request(raw), max_bytes=1 << 20)))
    if status == 413:
        exc = error_of(lambda: asyncio.run(read_json(make_request(raw), max_bytes=1024)))
    assert (exc.status, exc.code) == (status, code)
    assert fragment in exc.message


def test_declared_oversized_body_is_refused_before_reading() -> None:
    request = make_request(b"{}", {"content-length": str(10**9)})
    assert error_of(lambda: asyncio.run(read_json(request, max_bytes=1024))).status == 413


@pytest.mark.parametrize(
    ("model", "body", "param", "fragment"),
    [
        (CompletionRequest, [], None, "JSON object"),
        (CompletionRequest, {}, "prompt", "Field required"),
        (CompletionRequest, {"prompt": True}, "prompt", "expected one of str, list[str]"),
        (CompletionRequest, {"prompt": ["a", 1]}, "prompt", "expected one of"),
        (CompletionRequest, {"prompt": "a", "max_tokens": "5"}, "max_tokens", "integer"),
        (CompletionRequest, {"prompt": "a", "max_tokens": True}, "max_tokens", "integer"),
        (CompletionRequest, {"prompt": "a", "max_tokens": 0}, "max_tokens", "greater than"),
        (CompletionRequest, {"prompt": "a", "temperature": "hot"}, "temperature", "number"),
        (CompletionRequest, {"prompt": "a", "temperature": float("nan")}, "temperature", ""),
        (CompletionRequest, {"prompt": "a", "top_p": 0}, "top_p", "greater than"),
        (CompletionRequest, {"prompt": "a", "top_k": 2**64}, "top_k", "less than"),
        (CompletionRequest, {"prompt": "a", "stream": "yes"}, "stream", "boolean"),
        (CompletionRequest, {"prompt": "a", "max_tokens": 2.5}, "max_tokens", "integer"),
        (CompletionRequest, {"prompt": "a", "stop": ["a"] * 5}, "stop", "at most 4 items"),
        (CompletionRequest, {"prompt": "a", "stop": ""}, "stop", "stop: String should have"),
        (CompletionRequest, {"prompt": "a", "stop": ["a", ""]}, "stop", "stop.1: String"),
        (CompletionRequest, {"prompt": "a", "stop": 3}, "stop", "expected one of str"),
        (CompletionRequest, {"prompt": "a", "stream_options": {"x": 1}}, "stream_options", ""),
        (CompletionRequest, {"prompt": "a", "dp_rank": -1}, "dp_rank", "greater than"),
        (ChatRequest, {"messages": []}, "messages", "at least 1"),
        (ChatRequest, {"messages": "hi"}, "messages", "list"),
        (ChatRequest, {"messages": [{"role": "robot", "content": "x"}]}, "messages", "role"),
        (ChatRequest, {"messages": [{"role": "user", "content": 3}]}, "messages", "content"),
    ],
)
def test_invalid_fields_name_their_param(model, body, param, fragment) -> None:
    exc = error_of(lambda: parse(model, body))
    assert (exc.status, exc.param) == (400, param)
    assert fragment in exc.message
    assert set(exc.body()["error"]) == {"message", "type", "param", "code"}


def test_integral_floats_are_integers() -> None:
    req = parse(CompletionRequest, {"prompt": [72.0, 105], "max_tokens": 3.0, "n": 1.0})
    assert (req.prompt, req.max_tokens, req.n) == ([72, 105], 3, 1)
    assert all(type(t) is int for t in req.prompt)


def test_union_errors_are_one_line() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": [[1, "x"]]})
    param, message = describe_error(info.value)
    assert param == "prompt"
    assert message == (
        "prompt: invalid type or value; expected one of str, list[str], list[int], list[list[int]]"
    )


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "invalid_request_error"),
        (503, "service_unavailable"),
    ],
)
def test_error_body_is_openai_style(status: int, kind: str) -> None:
    body = APIError(status, "why", param="p", code="c").body()
    assert body == {"error": {"message": "why", "type": kind, "param": "p", "code": "c"}}


def test_chat_messages_reach_the_template_as_text_with_their_tool_fields() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}],
            },
            {"role": "tool", "content": "42", "tool_call_id": "call-1"},
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }
    req = parse(ChatRequest, body)
    assert [m.as_template_input() for m in req.messages] == [
        {"role": "user", "content": "hi"},
        {"role": "tool", "content": "42", "tool_call_id": "call-1"},
    ]
    assert req.tools == body["tools"]
    bad = parse(ChatRequest, {"messages": [{"role": "user", "content": [{"type": "image"}]}]})
    with pytest.raises(ValueError, match="only text"):
        bad.messages[0].as_template_input()


# ---- request checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"prompt": ""}, 400, "prompt", None),
        ({"prompt": []}, 400, "prompt", None),
        ({"prompt": [[]]}, 400, "prompt", None),
        ({"prompt": [512]}, 400, "prompt", None),  # outside the model's vocabulary (512 rows)
        ({"prompt": [-1, 5]}, 400, "prompt", None),
        ({"prompt": [2**40]}, 400, "prompt", None),
        ({"prompt": [1] * CONTEXT}, 400, "prompt", "context_length_exceeded"),
        ({"prompt": "a" * (CONTEXT + 5)}, 400, "prompt", "context_length_exceeded"),
        ({"prompt": "ab", "max_tokens": CONTEXT - 1}, 400, "max_tokens", "context_length_exceeded"),
        ({"prompt": "a", "n": 2}, 400, "n", None),
        ({"prompt": "a", "dp_rank": 2}, 400, "dp_rank", None),
    ],
)
def test_requests_the_ranks_cannot_serve_are_refused_up_front(body, status, param, code):
    core, ranks = make_ingress()
    exc = error_of(lambda: complete(core, **body))
    assert (exc.status, exc.param, exc.code) == (status, param, code)
    assert ranks.payloads == [], "a refused request must not reach a rank"


def test_max_tokens_fill_the_context_exactly() -> None:
    core, ranks = make_ingress()
    choices, _ = complete(core, prompt="ab", max_tokens=CONTEXT - 2)
    assert ranks.payloads[0].sampling.max_tokens == CONTEXT - 2
    assert choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("headers", "ok"),
    [({}, False), ({"authorization": "Bearer nope"}, False), ({"authorization": "Bearer k"}, True)],
)
def test_api_key(headers: dict[str, str], ok: bool) -> None:
    core, _ = make_ingress(api_key="k")
    if ok:
        core.check_auth(make_request(b"", headers))
    else:
        exc = error_of(lambda: core.check_auth(make_request(b"", headers)))
        assert (exc.status, exc.code) == (401, "invalid_api_key")


def test_unknown_model_is_404() -> None:
    core, _ = make_ingress()
    core.check_model(None)
    core.check_model("tiny-moe")
    exc = error_of(lambda: core.check_model("gpt-5"))
    assert (exc.status, exc.code, exc.param) == (404, "model_not_found", "model")


# ---- generation ----------------------------------------------------------------------------


def test_choices_stream_text_and_count_tokens() -> None:
    core, ranks = make_ingress()
    choices, deltas = complete(core, prompt=["Hi", "Yo"], max_tokens=3, ignore_eos=True)
    assert [c.text for c in choices] == ["Haa", "Yaa"]
    assert [c.output_token_ids for c in choices] == [[72, 97, 97], [89, 97, 97]]
    assert usage(choices) == {
        "prompt_tokens": 4,
        "completion_tokens": 6,
        "total_tokens": 10,
    }
    assert sorted(d.finish_reason for d in deltas if d.finish_reason) == ["length", "length"]
    assert all(s.sampling.stop_token_ids == () for s in ranks.payloads)


@pytest.mark.parametrize(
    ("prompt", "dp_rank", "ids"),
    [("Hi", None, ["abc"]), (["Hi", "Yo", "Ok"], 1, ["abc-0", "abc-1", "abc-2"])],
)
def test_each_choice_is_one_typed_request_under_the_response_id(
    prompt: str | list[str], dp_rank: int | None, ids: list[str]
) -> None:
    core, ranks = make_ingress()
    complete(core, request_id="abc", prompt=prompt, max_tokens=3, dp_rank=dp_rank)
    assert sorted(m.request_id for m in ranks.payloads) == ids
    texts = [prompt] if isinstance(prompt, str) else prompt
    by_id = {m.request_id: m for m in ranks.payloads}
    for rid, text in zip(ids, texts, strict=True):
        message = by_id[rid]
        assert message.prompt_token_ids == tuple(core.tokenizer.encode(text))
        assert message.dp_rank == dp_rank
        assert message.sampling == SamplingParams(
            max_tokens=3, temperature=1.0, stop_token_ids=(core.tokenizer.eos_token_id,)
        )
        assert message.to_request().request_id == rid


def test_sampling_is_built_once_and_fills_the_context_when_unset() -> None:
    core, _ = make_ingress()
    req = parse(CompletionRequest, {"prompt": "ab", "temperature": 0.5, "top_k": -1, "seed": 3})
    sampling = core.sampling_of(req, 2, "prompt", None)
    assert sampling == SamplingParams(
        max_tokens=CONTEXT - 2,
        temperature=0.5,
        top_k=0,
        seed=3,
        stop_token_ids=(core.tokenizer.eos_token_id,),
    )


def test_usage_adds_up_the_ranks_counts() -> None:
    counted = Choice(0, [1, 2], [5, 6, 7], usage=Usage(2, 3))
    # The rank's count wins over the tokens this choice happened to receive.
    behind = Choice(1, [1, 2, 3], [5], usage=Usage(3, 2))
    unanswered = Choice(2, [1, 2, 3, 4])  # no chunk yet: its prompt, nothing generated
    assert usage([counted, behind, unanswered]) == {
        "prompt_tokens": 9,
        "completion_tokens": 5,
        "total_tokens": 14,
    }


def test_eos_is_a_stop_token_unless_ignored() -> None:
    core, ranks = make_ingress()
    complete(core, prompt="a", max_tokens=2)
    assert ranks.payloads[0].sampling.stop_token_ids == (core.tokenizer.eos_token_id,)


def test_stop_string_cuts_the_text_and_cancels_the_rank_stream() -> None:
    core, ranks = make_ingress()
    choices, _ = complete(core, prompt="x", max_tokens=6, stop=["aa"])
    assert (choices[0].text, choices[0].finish_reason) == ("x", "stop")
    assert ranks.streams[0].cancelled


def test_a_failed_group_answers_503_with_retry_after_then_recovers(monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(ingress, "time", type("Clock", (), {"monotonic": lambda: clock[0]}))
    dead = [True]

    def reply(message: GenerateRequest) -> list[Any]:
        if dead[0]:
            return [tokens(65), RuntimeError("rank 1: DP group failed")]
        return echo_reply(message)

    core, _ = make_ingress(reply)
    exc = error_of(lambda: complete(core, prompt="a", max_tokens=3))
    assert (exc.status, exc.code) == (503, "group_unavailable")
    assert exc.headers == {"Retry-After": str(ingress.RETRY_AFTER_S)}

    dead[0] = False  # the gang restarts; until the window passes, callers are told to retry
    for check in (lambda: complete(core, prompt="a", max_tokens=3), core.check_available):
        exc = error_of(check)
        assert (exc.status, exc.code) == (503, "group_restarting")
        assert exc.headers["Retry-After"] == str(ingress.RETRY_AFTER_S)

    clock[0] += ingress.RETRY_AFTER_S + 0.1
    choices, _ = complete(core, prompt="a", max_tokens=3)
    assert choices[0].finish_reason == "length"


def test_sse_events_are_compact_json_lines() -> None:
    event = http_api.sse({"a": [1, 2]})
    assert event == 'data: {"a":[1,2]}\n\n'
    assert json.loads(event[len("data: ") :]) == {"a": [1, 2]}


def test_openapi_declares_the_request_bodies() -> None:
    import deployment.app  # noqa: F401  (registers the routes)

    doc = http_api.api.openapi()
    for path, model in (
        ("/v1/completions", "CompletionRequest"),
        ("/v1/chat/completions", "ChatRequest"),
    ):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{model}"}
    schemas = doc["components"]["schemas"]
    assert {"CompletionRequest", "ChatRequest", "ChatMessage", "StreamOptions"} <= set(schemas)
    assert "prompt" in schemas["CompletionRequest"]["required"]


def test_prompts_per_request_are_capped() -> None:
    core, ranks = make_ingress(max_prompts_per_request=3)
    exc = error_of(lambda: complete(core, prompt=["a", "b", "c", "d"]))
    assert (exc.status, exc.param) == (400, "prompt") and "at most 3" in exc.message
    assert ranks.payloads == []
