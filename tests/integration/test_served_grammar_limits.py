"""A structured-output request cannot stall its rank for everyone (the default model, served).

A schema over the ingress's limits is a 400 naming the limit; a compile past
``--max-grammar-compile-s`` is that request's 400 (or its stream's error event) while the
rank keeps serving the plain requests beside it, and no rank process restarts.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from helpers import COMPLETIONS, sse_events
from integration.conftest import REAL_MODEL

PLAIN = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}


def schema(properties: int) -> dict[str, Any]:
    props = {f"field_{i}": {"type": "string"} for i in range(properties)}
    return {"type": "object", "properties": props}


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{COMPLETIONS}", json=body, timeout=300)


def pids(app) -> list[int]:
    return [app.rank_call("stats_snapshot", rank)["pid"] for rank in (0, 1)]


def plain_beside(url: str, attack: dict[str, Any]) -> tuple[httpx.Response, list[httpx.Response]]:
    """The attack pinned to rank 0 with three plain completions pinned there too."""
    plain = [{"prompt": f"Count to ten, take {i}:", "dp_rank": 0, **PLAIN} for i in range(3)]
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(post, url, {**attack, "dp_rank": 0})
        others = list(pool.map(lambda body: post(url, body), plain))
    return first.result(), others


def check_plain(responses: list[httpx.Response]) -> None:
    for r in responses:
        assert r.status_code == 200, r.text[:300]
        assert r.json()["usage"]["completion_tokens"] == PLAIN["max_tokens"]


def test_a_schema_over_the_limits_is_refused_and_the_rank_serves_on(real_model) -> None:
    before = pids(real_model)
    # 1,000 properties (~25 KB): past max_grammar_properties (512), under the byte limit.
    attack = {"prompt": "JSON please:", "max_tokens": 8, "guided_json": schema(1000)}
    refused, plain = plain_beside(real_model.url, attack)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert "max_grammar_properties" in error["message"] and error["code"] == "grammar_too_large"
    check_plain(plain)
    assert pids(real_model) == before


# A time limit no compile can meet on any machine: the compile runs on the rank's grammar
# worker thread, so even a cached grammar takes a thread hop longer than this to come back.
# The outcome (a refusal) does not depend on how fast this machine compiles.
UNMEETABLE_COMPILE_S = 1e-6


def test_a_compile_past_its_time_limit_fails_alone(real_model) -> None:
    app = real_model
    app.deploy(model=REAL_MODEL, max_grammar_compile_s=UNMEETABLE_COMPILE_S)
    try:
        before = pids(app)
        # 500 properties: under every ingress limit; its compile goes on on the rank's
        # worker after the refusal while the plain requests beside it are served.
        attack = {"prompt": "JSON please:", "max_tokens": 8, "guided_json": schema(500)}
        refused, plain = plain_beside(app.url, attack)
        assert refused.status_code == 400, refused.text[:300]
        assert "--max-grammar-compile-s" in refused.json()["error"]["message"]
        check_plain(plain)
        # Streamed: the stream has started, so the refusal is its one error event.
        body = {**attack, "guided_json": schema(499), "stream": True}
        with httpx.stream("POST", f"{app.url}{COMPLETIONS}", json=body, timeout=300) as r:
            events = list(sse_events(r))
        if r.status_code == 200:
            errors = [e for e in events if isinstance(e, dict) and "error" in e]
            assert len(errors) == 1 and "--max-grammar-compile-s" in json.dumps(errors[0])
        else:
            assert r.status_code == 400
        assert pids(app) == before
    finally:
        app.deploy(model=REAL_MODEL)
