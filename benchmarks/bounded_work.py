"""A concurrent stream's inter-token latency while the ingress is flooded (issue 50).

Deploys a config (default ``deployment/configs/local.yaml``) on a local Ray cluster, then
streams one chat completion per scenario and reports its ITL p50/p99/max (seconds between
content chunks):

- ``alone``: the stream by itself;
- ``tiny-conversations``: while ``--flooders`` clients post batched chats back to back, each
  a body near ``max_request_bytes`` of one-word conversations, alternating with 256-conversation
  batches of long conversations (rendered in full, then refused: max_tokens past the context);
- ``background``: while the flooders create Responses API background responses
  (``background: true``, 32 tokens each) back to back.

Numbers only, never asserted. Run from the repository root::

    flock /tmp/roundgate-ray.lock .venv/bin/python benchmarks/bounded_work.py [--model tiny-moe]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

TINY = [{"role": "user", "content": "hi"}]


def flood_bodies(max_bytes: int) -> list[bytes]:
    count = (max_bytes - 200) // (len(json.dumps(TINY)) + 2)
    return [
        json.dumps({"messages": [TINY] * count, "max_tokens": 1}).encode(),
        json.dumps({"messages": [TINY * 110] * 256, "max_tokens": 10**6}).encode(),
    ]


def stream_itl(url: str, max_tokens: int) -> list[float]:
    body = {
        "messages": [{"role": "user", "content": "Count slowly."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    arrivals: list[float] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        arrivals = [time.monotonic() for line in r.iter_lines() if line.startswith("data: {")]
    return [b - a for a, b in itertools.pairwise(arrivals)]


def flood(url: str, kind: str, bodies: list[bytes], stop: threading.Event, i: int) -> None:
    headers = {"content-type": "application/json"}
    with httpx.Client(timeout=300) as client:
        for k in itertools.count(i):
            if stop.is_set():
                return
            if kind == "tiny-conversations":
                client.post(
                    f"{url}/v1/chat/completions/batch", content=bodies[k % 2], headers=headers
                )
            else:
                client.post(
                    f"{url}/v1/responses",
                    json={"input": "Say something.", "background": True, "max_output_tokens": 32},
                )


def scenario(url: str, kind: str, flooders: int, max_tokens: int, bodies: list[bytes]) -> dict:
    stop = threading.Event()
    threads = [
        threading.Thread(target=flood, args=(url, kind, bodies, stop, i), daemon=True)
        for i in range(flooders if kind != "alone" else 0)
    ]
    for t in threads:
        t.start()
    time.sleep(1.0 if threads else 0)
    gaps = stream_itl(url, max_tokens)
    stop.set()
    for t in threads:
        t.join(timeout=300)
    q = statistics.quantiles(gaps, n=100)
    return {"scenario": kind, "p50": q[49], "p99": q[98], "max": max(gaps), "n": len(gaps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("deployment/configs/local.yaml"))
    parser.add_argument("--model", default=None, help="override the config's model")
    parser.add_argument("--flooders", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    ns = parser.parse_args()

    from roundgate.deployment.local import (
        config_url,
        deploy,
        load_config,
        shutdown,
        start_local_cluster,
        wait_ready,
    )

    cfg = load_config(ns.config)
    args: dict[str, Any] = cfg["applications"][0]["args"]
    overrides = {"model": ns.model} if ns.model else {}
    url = config_url(cfg)
    start_local_cluster()
    import ray
    from ray import serve

    try:
        deploy(cfg, overrides)
        wait_ready(url)
        bodies = flood_bodies(int(args.get("max_request_bytes", 1 << 20)))
        stream_itl(url, 8)  # warm-up
        rows = [
            scenario(url, kind, ns.flooders, ns.max_tokens, bodies)
            for kind in ("alone", "tiny-conversations", "background")
        ]
    finally:
        shutdown(serve, ray)
    print("| scenario | ITL p50 (ms) | ITL p99 (ms) | max gap (ms) | gaps |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['p50'] * 1e3:.1f} | {r['p99'] * 1e3:.1f} | "
            f"{r['max'] * 1e3:.1f} | {r['n']} |"
        )


if __name__ == "__main__":
    main()
