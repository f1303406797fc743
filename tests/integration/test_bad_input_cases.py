"""Every bad input of issue 6 is a 4xx with an OpenAI error body while a rank-0 stream flows on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import (
    COMPLETIONS,
    MIB,
    BackgroundStream,
    check_error_body,
    check_still_serving,
    wait_until,
)

CONTEXT = 4096
CHAT = "/v1/chat/completions"


def body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# (case id, method, path, raw body, status, error code, param)
CASES = [
    ("invalid-json", "POST", COMPLETIONS, b'{"prompt": "hi",', 400, None, None),
    ("invalid-json-chat", "POST", CHAT, b"{messages: []}", 400, None, None),
    ("not-an-object", "POST", COMPLETIONS, b'["hi"]', 400, None, None),
    ("empty-body", "POST", COMPLETIONS, b"", 400, None, None),
    ("missing-prompt", "POST", COMPLETIONS, body({"max_tokens": 4}), 400, None, "prompt"),
    ("empty-prompt", "POST", COMPLETIONS, body({"prompt": ""}), 400, None, "prompt"),
    ("empty-prompt-list", "POST", COMPLETIONS, body({"prompt": []}), 400, None, "prompt"),
    ("empty-token-list", "POST", COMPLETIONS, body({"prompt": [[]]}), 400, None, "prompt"),
    ("missing-messages", "POST", CHAT, body({"max_tokens": 4}), 400, None, "messages"),
    ("empty-messages", "POST", CHAT, body({"messages": []}), 400, None, "messages"),
    ("prompt-wrong-type", "POST", COMPLETIONS, body({"prompt": 42}), 400, None, "prompt"),
    ("prompt-bools", "POST", COMPLETIONS, body({"prompt": [True]}), 400, None, "prompt"),
    (
        "max-tokens-string",
        "POST",
        COMPLETIONS,
        body({"prompt": "a", "max_tokens": "four"}),  # "4" is 4, as vLLM parses it
        400,
        None,
        "max_tokens",
    ),
    (
        "temperature-string",
        "POST",
        COMPLETIONS,
        body({"prompt": "a", "temperature": "hot"}),
        400,
        None,
        "temperature",
    ),
    (
        "stream-string",
        "POST",
        COMPLETIONS,
        body({"prompt": "a", "stream": "maybe"}),  # "yes" is true, as vLLM parses it
        400,
        None,
        "stream",
    ),
    ("messages-string", "POST", CHAT, body({"messages": "hi"}), 400, None, "messages"),
    (
        "image-content",
        "POST",
        CHAT,
        body({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        400,
        None,
        "messages",
    ),
    (
        "max-tokens-zero",
        "POST",
        COMPLETIONS,
        body({"prompt": "a", "max_tokens": 0}),
        400,
        None,
        "max_tokens",
    ),
    (
        "max-tokens-negative",
        "POST",
        CHAT,
        body({"messages": [{"role": "user", "content": "a"}], "max_tokens": -3}),
        400,
        None,
        "max_tokens",
    ),
    (
        "max-tokens-beyond-context",
        "POST",
        COMPLETIONS,
        body({"prompt": "a", "max_tokens": CONTEXT}),
        400,
        "context_length_exceeded",
        "max_tokens",
    ),
    (
        "prompt-beyond-context",
        "POST",
        COMPLETIONS,
        body({"prompt": "a" * (CONTEXT + 10), "max_tokens": 1}),
        400,
        "context_length_exceeded",
        "prompt",
    ),
    (
        "token-prompt-beyond-context",
        "POST",
        COMPLETIONS,
        body({"prompt": [65] * CONTEXT}),
        400,
        "context_length_exceeded",
        "prompt",
    ),
    (
        "chat-beyond-context",
        "POST",
        CHAT,
        body({"messages": [{"role": "user", "content": "a" * CONTEXT}]}),
        400,
        "context_length_exceeded",
        "messages",
    ),
    ("token-out-of-vocab", "POST", COMPLETIONS, body({"prompt": [1, 99999]}), 400, None, "prompt"),
    (
        "top-k-overflow",
        "POST",
        COMPLETIONS,
        body({"prompt": "a", "top_k": 2**70}),
        400,
        None,
        "top_k",
    ),
    (
        "unknown-model",
        "POST",
        COMPLETIONS,
        body({"prompt": "a", "model": "gpt-5"}),
        404,
        "model_not_found",
        "model",
    ),
    (
        "unknown-model-chat",
        "POST",
        CHAT,
        body({"messages": [{"role": "user", "content": "a"}], "model": "x"}),
        404,
        "model_not_found",
        "model",
    ),
    ("n-65", "POST", COMPLETIONS, body({"prompt": "a", "n": 65}), 400, None, "n"),
    ("unknown-field", "POST", COMPLETIONS, body({"prompt": "a", "mood": 1}), 400, None, "mood"),
    (
        "n-65-chat",
        "POST",
        CHAT,
        body({"messages": [{"role": "user", "content": "a"}], "n": 65}),
        400,
        None,
        "n",
    ),
    (
        "oversized-body",
        "POST",
        COMPLETIONS,
        body({"prompt": "a" * (MIB + 10)}),
        413,
        "body_too_large",
        None,
    ),
    ("non-utf8", "POST", COMPLETIONS, b'{"prompt": "caf\xe9"}', 400, None, None),
    (
        "non-utf8-chat",
        "POST",
        CHAT,
        b'{"messages": [{"role": "user", "content": "\xff"}]}',
        400,
        None,
        None,
    ),
    (
        "dp-rank-out-of-range",
        "POST",
        COMPLETIONS,
        body({"prompt": "a", "dp_rank": 7}),
        400,
        None,
        "dp_rank",
    ),
    ("unknown-path", "GET", "/v1/nope", b"", 404, None, None),
    ("wrong-method", "GET", COMPLETIONS, b"", 405, None, None),
]


@pytest.mark.parametrize(
    ("method", "path", "raw", "status", "code", "param"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_bad_input_is_a_4xx_and_loses_nothing(
    app, http, in_flight, method, path, raw, status, code, param
) -> None:
    headers = {"content-type": "application/json"}
    r = http.request(method, path, content=raw, headers=headers)
    check_error_body(r, status, code, param)
    check_still_serving(app)


def test_oversized_chunked_body_is_413(app, http, in_flight) -> None:
    chunk = b"a" * (64 << 10)

    def parts() -> Iterator[bytes]:  # no Content-Length: the ingress must count the bytes
        yield b'{"prompt": "'
        for _ in range(20):
            yield chunk
        yield b'"}'

    r = http.post(COMPLETIONS, content=parts(), headers={"content-type": "application/json"})
    check_error_body(r, 413, "body_too_large", None)
    check_still_serving(app)


def test_client_disconnect_mid_stream_frees_the_pages(app, in_flight) -> None:
    before = app.rank_call("stats_snapshot", 1)["aborts"]
    stream = BackgroundStream(app.url, prompt="bye", max_tokens=3000, ignore_eos=True, dp_rank=1)
    assert stream.started.wait(60)
    assert app.rank_call("stats_snapshot", 1)["running"] == 1
    stream.close()

    def freed() -> dict[str, Any] | None:
        s = app.rank_call("stats_snapshot", 1)
        idle = s["running"] == s["waiting"] == 0 and s["kv_occupancy"] == 0
        return s if idle else None

    stats = wait_until(freed, timeout_s=30)
    assert stats["aborts"] == before + 1
    assert app.rank_call("check_pool", 1)
    check_still_serving(app)


def test_the_in_flight_stream_was_unaffected(app, http, in_flight) -> None:
    """Every bad input, sent here while the rank-0 stream flows: it keeps going, with no error
    event (self-contained: it does not rely on the cases above having run first)."""
    for case_id, method, path, raw, status, _code, _param in CASES:
        r = http.request(method, path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == status, (case_id, r.text)
    seen = len(in_flight.events)
    wait_until(lambda: len(in_flight.events) > seen + 5, timeout_s=30)
    assert not in_flight.done.is_set() and in_flight.error is None
    assert not [e for e in in_flight.events if isinstance(e, dict) and "error" in e]
    assert all(
        e["choices"][0]["finish_reason"] is None for e in in_flight.events if isinstance(e, dict)
    )
    in_flight.close()
    wait_until(lambda: app.rank_call("stats_snapshot", 0)["running"] == 0, timeout_s=30)
    assert all(app.rank_call("check_pool", r) for r in (0, 1))
