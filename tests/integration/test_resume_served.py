"""Resumption, served for real: a rank SIGKILLed under eight greedy streams, and every stream
goes on to its end with no error and the text of an uninterrupted greedy run of its prompt.

Today a dead rank restarts its whole gang (Ray Serve's gang policy), so the streams of both
ranks resume once the fresh gang serves (``roundgate.deployment.resume``: each unfinished stream is
resubmitted as a continuation of the tokens it already streamed). The test breaks the
session's shared deployment on purpose and returns only once it serves on every rank again.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
from helpers import BackgroundStream, wait_for
from test_faults import RESTART_DEADLINE_S, wait_fresh_gang, wait_serving

if TYPE_CHECKING:
    from integration.conftest import Deployment

STREAMS = 8
# Long enough that every stream is still running when the rank dies (tiny preset on two
# cores), short enough for all eight continuations to fit one rank's KV pool (512 pages of
# 16 tokens): the first rank of the restarted gang that Serve announces may get them all.
TOKENS = 800
GREEDY = {"max_tokens": TOKENS, "ignore_eos": True, "temperature": 0}


def prompt_of(i: int) -> list[int]:
    return [5 + i, 17, 60 + 3 * i, 9]


def reference(url: str, prompt: list[int]) -> dict[str, Any]:
    """The uninterrupted greedy answer: text, token ids and usage."""
    r = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": prompt, "return_token_ids": True, **GREEDY},
        timeout=600,
    )
    r.raise_for_status()
    body = r.json()
    choice = body["choices"][0]
    return {"text": choice["text"], "ids": choice["token_ids"], "usage": body["usage"]}


def streamed(stream: BackgroundStream) -> dict[str, Any]:
    """What a stream delivered: text, token ids, finish reasons, errors and its last usage."""
    chunks = [e for e in stream.events if isinstance(e, dict)]
    choices = [c for e in chunks if "choices" in e for c in e["choices"]]
    usages = [e["usage"] for e in chunks if e.get("usage")]
    return {
        "text": "".join(c["text"] for c in choices),
        "ids": [t for c in choices for t in c.get("token_ids") or []],
        "finish": [c["finish_reason"] for c in choices if c["finish_reason"]],
        "errors": [e["error"] for e in chunks if "error" in e],
        "usage": usages[-1] if usages else None,
        "done": stream.events[-1:] == ["[DONE]"],
    }


def resumed_total(url: str) -> float:
    return sum(float(line.split()[-1]) for line in resumed_lines(url))


def resumed_lines(url: str) -> list[str]:
    """The exposition's samples of ``roundgate_requests_resumed_total``."""
    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    return [line for line in text.splitlines() if line.startswith("roundgate_requests_resumed")]


def test_greedy_streams_survive_a_killed_rank_with_the_uninterrupted_text(app: Deployment) -> None:
    wait_serving(app)
    # All at once: the greedy path is batch-invariant (what the resumed streams are held to),
    # and eight 800-token answers one after another would cost two minutes.
    with ThreadPoolExecutor(STREAMS) as pool:
        want = list(pool.map(lambda i: reference(app.url, prompt_of(i)), range(STREAMS)))
    resumed_before = resumed_total(app.url)
    victim = app.rank_call("stats_snapshot", 1)
    streams = [
        BackgroundStream(
            app.url,
            prompt=prompt_of(i),
            return_token_ids=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
        for i in range(STREAMS)
    ]
    try:
        for s in streams:
            assert s.started.wait(120), "a stream never produced its first chunk"
        running = [not s.done.is_set() for s in streams]
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        for i, s in enumerate(streams):
            assert s.done.wait(RESTART_DEADLINE_S), f"stream {i} never ended"
        ended_s = time.monotonic() - killed_at
    finally:
        for s in streams:
            s.close(timeout=5)
    assert all(running), f"streams ended before the kill (nothing to resume): {running}"
    for i, (s, w) in enumerate(zip(streams, want, strict=True)):
        got = streamed(s)
        assert s.error is None, f"stream {i}: {s.error!r}"
        assert got["errors"] == [], f"stream {i}: {got['errors']}"
        assert got["done"] and got["finish"] == ["length"], f"stream {i}: {got['finish']}"
        assert got["ids"] == w["ids"], f"stream {i}: first difference at {first_diff(got, w)}"
        assert got["text"] == w["text"]
        assert got["usage"] == w["usage"], f"stream {i}: usage {got['usage']} != {w['usage']}"
    # Each stream cut by the kill was resubmitted at least once (the ingress pushes its
    # counters to the metrics hub every few seconds).
    wait_for(
        lambda: resumed_lines(app.url),
        60,
        f"roundgate_requests_resumed_total to count the {STREAMS} streams (before: "
        f"{resumed_before})",
        until=lambda lines: sum(float(x.split()[-1]) for x in lines) - resumed_before >= STREAMS,
    )
    resumed = resumed_total(app.url) - resumed_before
    print(
        f"{STREAMS} streams, {resumed:.0f} resumptions after a SIGKILL: "
        f"all ended {ended_s:.1f} s after the kill"
    )
    wait_fresh_gang(app, victim["gang_id"])


def first_diff(got: dict[str, Any], want: dict[str, Any]) -> int | None:
    pairs = zip(got["ids"], want["ids"], strict=False)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), None)
