"""Every bad input of issue 6 gets its 4xx with an OpenAI-style error body, and loses nothing.

A long greedy stream on rank 0 runs through all the cases (module fixture ``in_flight``);
after each case a good request must still succeed, and at the end the stream must still be
flowing without an error event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.helpers import BackgroundStream, complete, wait_until

MIB = 1 << 20
CONTEXT = 4096
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


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
        body({"prompt": "a", "max_tokens": "4"}),
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
        body({"prompt": "a", "stream": "yes"}),
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
    ("n-2", "POST", COMPLETIONS, body({"prompt": "a", "n": 2}), 400, None, "n"),
    (
        "n-2-chat",
        "POST",
        CHAT,
        body({"messages": [{"role": "user", "content": "a"}], "n": 2}),
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


@pytest.fixture(scope="module")
def in_flight(app) -> Iterator[BackgroundStream]:
    stream = BackgroundStream(
        app.url, prompt=[5, 6, 7], max_tokens=3000, ignore_eos=True, temperature=0, dp_rank=0
    )
    assert stream.started.wait(60)
    yield stream
    stream.close()


@pytest.fixture(scope="module")
def http(app) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=app.url, timeout=60) as client:
        yield client


def check_error_body(r: httpx.Response, status: int, code: str | None, param: str | None) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param


def check_still_serving(app) -> None:
    r = complete(app.url, prompt="still there?", max_tokens=2)
    assert r["choices"][0]["finish_reason"] in ("length", "stop")


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


def test_the_in_flight_stream_was_unaffected(app, in_flight) -> None:
    """Runs after the cases above: the rank-0 stream kept going, with no error event."""
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


def test_api_key_is_required_when_set(redeploy) -> None:
    from deployment.local import deploy

    # conftest's readiness probe sends no key, so deploy directly; ``redeploy`` restores the
    # default (keyless) app afterwards because overrides are set.
    redeploy.overrides = {"api_key": "sekrit"}
    deploy(redeploy.cfg, redeploy.overrides)
    url = redeploy.url
    good = {"authorization": "Bearer sekrit"}
    prompt = {"prompt": "a", "max_tokens": 1}

    def ready() -> bool:
        try:
            r = httpx.post(f"{url}{COMPLETIONS}", json=prompt, headers=good, timeout=30)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    wait_until(ready, timeout_s=120, interval_s=0.5)
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "sekrit"}):
        for method, path, payload in (("POST", COMPLETIONS, prompt), ("GET", "/v1/models", None)):
            r = httpx.request(method, f"{url}{path}", json=payload, headers=headers, timeout=60)
            check_error_body(r, 401, "invalid_api_key", None)
    assert httpx.get(f"{url}/v1/models", headers=good, timeout=60).status_code == 200
    assert httpx.get(f"{url}/health", timeout=60).status_code == 200  # probes need no key


def test_a_50_mb_body_gets_the_413_body_not_a_reset(app, http, in_flight) -> None:
    raw = b'{"prompt": "' + b"a" * (50 * MIB) + b'"}'
    r = http.post(COMPLETIONS, content=raw, headers={"content-type": "application/json"})
    check_error_body(r, 413, "body_too_large", None)
    check_still_serving(app)


@pytest.mark.parametrize("depth", [100_000])
def test_deeply_nested_json_is_a_400_with_the_openai_body(app, http, in_flight, depth) -> None:
    raw = b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    r = http.post(COMPLETIONS, content=raw, headers={"content-type": "application/json"})
    check_error_body(r, 400, None, None)
    check_still_serving(app)
