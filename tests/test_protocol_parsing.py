"""Request parsing without Ray: unreadable bodies, invalid fields, error bodies, SSE, OpenAPI."""

from __future__ import annotations

import asyncio
import json

import pytest
from ingress_fakes import error_of, make_request

from roundgate.deployment.openai.api import api, read_json
from roundgate.deployment.openai.errors import APIError, describe_error
from roundgate.deployment.openai.protocol import ChatRequest, CompletionRequest, parse
from roundgate.deployment.openai.sse import sse

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
        # "5" is accepted (vLLM's lax parsing: tests/test_vllm_compat.py)
        (CompletionRequest, {"prompt": "a", "max_tokens": "five"}, "max_tokens", "integer"),
        (CompletionRequest, {"prompt": "a", "max_tokens": True}, "max_tokens", "integer"),
        (CompletionRequest, {"prompt": "a", "max_tokens": -1}, "max_tokens", "greater than"),
        (CompletionRequest, {"prompt": "a", "max_tokens": 0}, "max_tokens", "needs echo"),
        (ChatRequest, {"messages": [{"role": "user"}], "max_tokens": 0}, "max_tokens", "greater"),
        (CompletionRequest, {"prompt": "a", "temperature": "hot"}, "temperature", "number"),
        (CompletionRequest, {"prompt": "a", "temperature": float("nan")}, "temperature", ""),
        (CompletionRequest, {"prompt": "a", "top_p": 0}, "top_p", "greater than"),
        (CompletionRequest, {"prompt": "a", "top_k": 2**64}, "top_k", "less than"),
        (CompletionRequest, {"prompt": "a", "stream": "maybe"}, "stream", "boolean"),
        (CompletionRequest, {"prompt": "a", "max_tokens": 2.5}, "max_tokens", "integer"),
        (CompletionRequest, {"prompt": "a", "stop": ["a"] * 5}, "stop", "at most 4 items"),
        (CompletionRequest, {"prompt": "a", "stop": ""}, "stop", "stop: String should have"),
        (CompletionRequest, {"prompt": "a", "stop": ["a", ""]}, "stop", "stop.1: String"),
        (CompletionRequest, {"prompt": "a", "stop": 3}, "stop", "expected one of str"),
        (CompletionRequest, {"prompt": "a", "stream_options": "x"}, "stream_options", ""),
        (CompletionRequest, {"prompt": "a", "dp_rank": -1}, "dp_rank", "greater than"),
        (ChatRequest, {"messages": []}, "messages", "at least 1"),
        (ChatRequest, {"messages": "hi"}, "messages", "list"),
        (ChatRequest, {"messages": [{"role": "", "content": "x"}]}, "messages", "role"),
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


def test_sse_events_are_compact_json_lines() -> None:
    event = sse({"a": [1, 2]})
    assert event == 'data: {"a":[1,2]}\n\n'
    assert json.loads(event[len("data: ") :]) == {"a": [1, 2]}


def test_openapi_declares_the_request_bodies() -> None:
    import roundgate.deployment.app  # noqa: F401  (registers the routes)

    doc = api.openapi()
    for path, model in (
        ("/v1/completions", "CompletionRequest"),
        ("/v1/chat/completions", "ChatRequest"),
    ):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{model}"}
    schemas = doc["components"]["schemas"]
    assert {"CompletionRequest", "ChatRequest", "ChatMessage", "StreamOptions"} <= set(schemas)
    assert "prompt" in schemas["CompletionRequest"]["required"]
