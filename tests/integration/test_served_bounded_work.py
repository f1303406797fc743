"""Bounded work: a flood of batched chats full of tiny conversations does not stall a
concurrent stream (issue 50, deliverable 2).

One ingress replica drives every stream on one asyncio loop. Before, a batched chat's
conversations were parsed and rendered on that loop before anything was checked: one body
near ``max_request_bytes`` of one-word conversations held the loop for as long as its
``T_body`` of parses and renders took, and every other stream's next chunk waited for it.

The bound (derived, not tuned): the stream's largest inter-chunk gap under the flood stays
below ``baseline + T_body / 2``, where ``baseline`` is the largest gap the same stream shows
alone (measured first, in the same test) and ``T_body`` is what preparing one flood body costs
(timed here, in-process, with the ingress's own parse and render: a lower bound of what it
costs on a replica that shares two cores with the ranks). The old code stalls the stream for
at least ``T_body`` per flood body (and the bodies chain), so it breaks the bound by
``T_body / 2``, about 0.3 s on two cores; the new one only reads each body's JSON on the loop
(about 1/30 of ``T_body``) before the count check refuses it, and renders legitimate batches on
a worker thread.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

import httpx
from helpers import MIB

BATCH = "/v1/chat/completions/batch"
TINY = [{"role": "user", "content": "hi"}]
# A legitimate-sized batch (at the 256-conversation cap) whose conversations are long enough
# to fill the body: rendered in full, then refused (max_tokens past the context), so it costs
# the ingress its renders and the ranks nothing.
LONG_CONVERSATION = [{"role": "user", "content": "hi"}] * 110
NUM_FLOODERS = 3


def tiny_conversations_body(max_bytes: int) -> bytes:
    """A batched chat body just under ``max_bytes``, every conversation one word."""
    one = len(json.dumps(TINY)) + 2
    count = (max_bytes - 200) // one
    return json.dumps({"messages": [TINY] * count, "max_tokens": 1}).encode()


def long_conversations_body() -> bytes:
    return json.dumps({"messages": [LONG_CONVERSATION] * 256, "max_tokens": 10**6}).encode()


def prepare_cost_s(body: bytes) -> float:
    """What the old ingress did with ``body`` on its loop before any check: every
    conversation parsed and rendered (the tiny-moe preset's byte tokenizer), timed here."""
    from roundgate.actors.model.tokenizer import ByteTokenizer
    from roundgate.deployment.openai.chat import chat_options, chat_prompt_ids
    from roundgate.deployment.openai.protocol import ChatRequest, parse

    data = json.loads(body)
    start = time.perf_counter()
    tokenizer = ByteTokenizer()
    for conversation in data["messages"]:
        req = parse(ChatRequest, {**data, "messages": conversation})
        chat_prompt_ids(tokenizer, req.messages, None, chat_options(req))
    return time.perf_counter() - start


def stream_gaps(url: str, max_tokens: int) -> list[float]:
    """A streaming chat completion's inter-chunk gaps, seconds (first chunk onward)."""
    body = {
        "messages": [{"role": "user", "content": "Count slowly."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    arrivals: list[float] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())
    assert len(arrivals) >= max_tokens  # every token arrived
    return [b - a for a, b in itertools.pairwise(arrivals)]


class Flood:
    """``NUM_FLOODERS`` threads posting flood bodies back to back until stopped."""

    def __init__(self, url: str, bodies: list[bytes]) -> None:
        self.url, self.bodies = url, bodies
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(NUM_FLOODERS)]

    def _run(self, i: int) -> None:
        headers = {"content-type": "application/json"}
        with httpx.Client(timeout=120) as client:
            k = i
            while not self.stop.is_set():
                r = client.post(f"{self.url}{BATCH}", content=self.bodies[k % 2], headers=headers)
                self.statuses.append(r.status_code)
                k += 1

    def __enter__(self) -> Flood:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def test_a_flood_of_tiny_conversations_does_not_stall_a_concurrent_stream(app) -> None:
    max_bytes = int(app.args.get("max_request_bytes", MIB))
    bodies = [tiny_conversations_body(max_bytes), long_conversations_body()]
    assert all(len(b) <= max_bytes for b in bodies)
    t_body = prepare_cost_s(bodies[0])
    stream_gaps(app.url, 8)  # warm: the first stream's gaps include the ranks' warm-up
    baseline = max(stream_gaps(app.url, 48))
    with Flood(app.url, bodies) as flood:
        time.sleep(0.5)  # the flood is under way before the stream starts
        flooded = max(stream_gaps(app.url, 48))
    bound = baseline + t_body / 2
    print(
        f"baseline {baseline:.3f}s, T_body {t_body:.3f}s, flooded {flooded:.3f}s, "
        f"bound {bound:.3f}s, flood answers {len(flood.statuses)}"
    )
    assert flood.statuses and set(flood.statuses) == {400}  # every flood body refused
    assert flooded < bound, (
        f"largest gap {flooded:.3f}s under the flood; bound {bound:.3f}s "
        f"(alone {baseline:.3f}s + T_body {t_body:.3f}s / 2)"
    )
