"""Serve overhead: time to first token through HTTP vs calling the rank replica directly.

    .venv/bin/python benchmarks/bench_serve_overhead.py [--requests 50] [--port 18802]
        [--attach] [--prompt Hello] [--json out.json]

Starts a local Ray cluster on loopback and deploys ``deployment/configs/local.yaml`` on
``--port`` (``--attach``: use the running cluster and app instead, e.g. ``make serve`` with
``--port 8000``). On the idle deployment it alternates two ways of asking rank 0 for the
same greedy token of the same short prompt, one request at a time:

- **http**: ``POST /v1/completions`` with ``stream: true`` over a kept-alive connection;
  TTFT is the time from sending to the first SSE ``data:`` event.
- **direct**: the rank deployment's streaming ``generate`` through a ``DeploymentHandle``
  from this driver; TTFT is the time to the first chunk.

Both pin ``dp_rank`` 0 and ask for one token, so the rank does the same work; the difference
of the medians is what the proxy, the ingress (parse, tokenize, detokenize, SSE) and the
extra hop add. Target: at most 15 ms. Two floors put that number in context: ``health``
(``GET /health``: proxy and ingress, no rank) and ``unary`` (a trivial handle call to the
rank: one Serve hop, no engine work).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from roundgate.actors.control.messages import RankTarget

REPO = Path(__file__).resolve().parents[1]
TARGET_MS = 15.0


async def http_ttft(client: httpx.AsyncClient, prompt: str) -> float:
    body = {
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "dp_rank": 0,
    }
    first = None
    start = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():  # read to [DONE] so the connection is reused
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("no SSE event")
    return first


async def direct_ttft(ranks: Any, prompt_ids: list[int]) -> float:
    from roundgate.actors.control.messages import GenerateRequest
    from roundgate.actors.control.request import SamplingParams

    message = GenerateRequest(
        request_id=f"bench-{uuid.uuid4().hex}",
        prompt_token_ids=tuple(prompt_ids),
        sampling=SamplingParams(max_tokens=1),
        dp_rank=0,
    )
    first = None
    start = time.perf_counter()
    async for _ in ranks.generate.remote(message):
        if first is None:
            first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("no chunk")
    return first


async def floor_http(client: httpx.AsyncClient) -> float:
    """``GET /health``: the proxy and the ingress, no rank."""
    start = time.perf_counter()
    (await client.get("/health")).raise_for_status()
    return time.perf_counter() - start


async def floor_handle(unary_ranks: Any) -> float:
    """A trivial unary call to rank 0: one Serve handle hop, no engine work."""
    start = time.perf_counter()
    await unary_ranks.check_pool.remote(RankTarget(0))
    return time.perf_counter() - start


def summarize(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in seconds)
    return {
        "median_ms": statistics.median(ms),
        "p10_ms": ms[len(ms) // 10],
        "p90_ms": ms[(len(ms) * 9) // 10],
        "min_ms": ms[0],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from ray import serve

    from roundgate.actors.model.tokenizer import ByteTokenizer

    # Inside the event loop: a handle's router may live on the caller's loop (Serve's
    # throughput-optimized mode), and the HTTP client shares the same loop either way.
    unary_ranks = serve.get_deployment_handle("RankReplica", app_name="roundgate")
    ranks = unary_ranks.options(stream=True)
    prompt_ids = ByteTokenizer().encode(args.prompt)
    url = f"http://127.0.0.1:{args.port}"
    samples: dict[str, list[float]] = {"http": [], "direct": [], "health": [], "unary": []}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for _ in range(args.warmup):
            await http_ttft(client, args.prompt)
            await direct_ttft(ranks, prompt_ids)
        for i in range(args.requests):
            # Alternate the order so neither path always follows the other.
            order = ("http", "direct") if i % 2 == 0 else ("direct", "http")
            for name in order:
                await asyncio.sleep(args.gap_s)  # the group goes back to idle in between
                if name == "http":
                    samples[name].append(await http_ttft(client, args.prompt))
                else:
                    samples[name].append(await direct_ttft(ranks, prompt_ids))
            samples["health"].append(await floor_http(client))
            samples["unary"].append(await floor_handle(unary_ranks))
    result: dict[str, Any] = {name: summarize(s) for name, s in samples.items()}
    result["added_median_ms"] = result["http"]["median_ms"] - result["direct"]["median_ms"]
    # Adjacent http/direct pairs share the machine's load at that moment: the median of their
    # differences is steadier than the difference of medians on a busy box.
    pairs = [h - d for h, d in zip(samples["http"], samples["direct"], strict=True)]
    result["paired_added_median_ms"] = statistics.median(pairs) * 1e3
    result["target_ms"] = TARGET_MS
    result["requests"] = args.requests
    result["prompt_tokens"] = len(prompt_ids)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50, help="timed requests per path")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests per path")
    parser.add_argument("--gap-s", type=float, default=0.05, help="idle time before each")
    parser.add_argument("--prompt", default="Hello")
    parser.add_argument("--port", type=int, default=18802, help="HTTP port (loopback)")
    parser.add_argument("--attach", action="store_true", help="use the running cluster/app")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument(
        "--throughput-optimized",
        action="store_true",
        help="start the cluster with RAY_SERVE_THROUGHPUT_OPTIMIZED=1 (Serve's low-overhead "
        "mode: user code on the replica's loop, gRPC between replicas, direct ingress)",
    )
    args = parser.parse_args(argv)
    if args.requests < 2 or args.warmup < 0 or args.gap_s < 0:
        parser.error("--requests must be >= 2; --warmup and --gap-s >= 0")

    from roundgate.deployment.local import (
        LOOPBACK_ENV,
        deploy,
        load_config,
        shutdown,
        start_local_cluster,
    )

    if args.attach:
        for key, value in LOOPBACK_ENV.items():
            os.environ.setdefault(key, value)
        import ray

        ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    else:
        if args.throughput_optimized:
            os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"
        cfg = load_config(REPO / "deployment" / "configs" / "local.yaml")
        cfg["http_options"].update(host="127.0.0.1", port=args.port)
        start_local_cluster(num_cpus=4)
        deploy(cfg)
    import ray
    from ray import serve

    try:
        result = asyncio.run(run(args))
    finally:
        if not args.attach:
            shutdown(serve, ray)
    print(
        f"TTFT over {result['requests']} requests per path, {result['prompt_tokens']}-token "
        "prompt, 1 new token, idle deployment"
    )
    print(f"{'path':8} {'median':>8} {'p10':>8} {'p90':>8} {'min':>8}  (ms)")
    for name in ("http", "direct", "health", "unary"):
        r = result[name]
        print(
            f"{name:8} {r['median_ms']:8.2f} {r['p10_ms']:8.2f} {r['p90_ms']:8.2f} "
            f"{r['min_ms']:8.2f}"
        )
    added = result["added_median_ms"]
    verdict = "within" if added <= TARGET_MS else "OVER"
    print(
        f"added by HTTP + ingress: {added:.2f} ms median of http - median of direct "
        f"({verdict} the {TARGET_MS:.0f} ms target); "
        f"median of paired differences {result['paired_added_median_ms']:.2f} ms"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
