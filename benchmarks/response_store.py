"""The shared Responses store's latency per call, over loopback, as an ingress replica sees it.

    flock /tmp/roundgate-ray.lock .venv/bin/python benchmarks/response_store.py \
        [--calls 2000] [--conversation-bytes 4000] [--no-snapshot]

Starts a local Ray cluster (loopback, no dashboard), the store's actor as the ingress makes
it (pinned to the head node, written through to SQLite in a temporary directory unless
``--no-snapshot``; unnamed, so a running deployment's store is left alone), and times
from this driver's event loop, through ``StoredResponses`` (the ingress's client, with its
timeout), each call the Responses routes make: ``put`` of a completed response whose
conversation is ``--conversation-bytes`` of text, ``get`` of one, ``cancel`` of a queued
background response, ``renew`` of one lease (the owner's heartbeat, every 0.25 s while it
runs). Prints p50 and p99 per call, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from roundgate.deployment.openai.response_store import StoredResponse
from roundgate.deployment.openai.stored_responses import StoredResponses


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls timed per kind")
    parser.add_argument(
        "--conversation-bytes", type=int, default=4000, help="text in each stored conversation"
    )
    parser.add_argument(
        "--no-snapshot", action="store_true", help="the actor without its SQLite file"
    )
    return parser.parse_args()


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    cuts = statistics.quantiles(samples, n=100)
    return cuts[49] * 1e3, cuts[98] * 1e3


async def timed(calls: int, call: Callable[[int], Awaitable[Any]]) -> list[float]:
    seconds = []
    for i in range(calls):
        start = time.perf_counter()
        await call(i)
        seconds.append(time.perf_counter() - start)
    return seconds


async def measure(store: StoredResponses, calls: int, text: str) -> dict[str, list[float]]:
    def done(i: int) -> StoredResponse:
        messages = ({"role": "user", "content": text}, {"role": "assistant", "content": "ok"})
        return StoredResponse(messages=messages, body={"id": f"d{i}", "status": "completed"})

    def queued(i: int) -> StoredResponse:
        body = {"id": f"b{i}", "status": "queued"}
        return StoredResponse(body=body, background=True, owner="bench")

    await timed(50, lambda i: store.put(f"warm{i}", done(i)))  # the actor started, warm
    results = {"put": await timed(calls, lambda i: store.put(f"d{i}", done(i)))}
    results["get"] = await timed(calls, lambda i: store.get(f"d{i}"))
    for i in range(calls):
        await store.put(f"b{i}", queued(i))
    results["renew"] = await timed(calls, lambda i: store.renew("bench", [f"b{i}"]))
    results["cancel"] = await timed(calls, lambda i: store.cancel(f"b{i}"))
    return results


def main() -> None:
    args = parse_args()
    import ray

    from roundgate.actors.head_node import on_head_node
    from roundgate.deployment.local import start_local_cluster
    from roundgate.deployment.response_store_actor import ResponseStoreActor

    start_local_cluster(num_cpus=1)
    with tempfile.TemporaryDirectory() as tmp:
        actor = (
            ray.remote(ResponseStoreActor)
            .options(num_cpus=0, **on_head_node())
            .remote(str(Path(tmp) / "responses.sqlite"), snapshot=not args.no_snapshot)
        )
        ray.get(actor.ping.remote())
        store = StoredResponses(actor=actor)
        text = "x" * args.conversation_bytes
        results = asyncio.run(measure(store, args.calls, text))
    snapshot = "off" if args.no_snapshot else "SQLite write-through"
    print(f"response store over loopback: {args.calls} calls each, snapshot {snapshot}")
    for name, seconds in results.items():
        p50, p99 = percentiles(seconds)
        print(f"  {name:<7} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms")
    ray.shutdown()


if __name__ == "__main__":
    main()
