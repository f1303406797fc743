"""Plain completions beside a huge structured-output grammar compiling on the same rank.

    .venv/bin/python benchmarks/grammar_beside.py [--properties 3000] [--plain 3]

Deploys ``deployment/configs/local.yaml`` (the default model) with the ingress's grammar limits
raised so a ``--properties``-property JSON schema reaches a rank (past the default limits it is a
400 in milliseconds), then times ``--plain`` 32-token completions pinned to rank 0: alone, and
again while that schema compiles on rank 0. With the compile off the engine's path the plain
latencies barely move; before, they waited for the whole compile.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

PLAIN = {"max_tokens": 32, "temperature": 0, "ignore_eos": True, "dp_rank": 0}


def timed_post(url: str, body: dict[str, Any]) -> tuple[int, float]:
    started = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    return r.status_code, time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--properties", type=int, default=3000)
    p.add_argument("--plain", type=int, default=3)
    ns = p.parse_args()
    from roundgate.deployment.local import (
        deploy,
        load_config,
        shutdown,
        start_local_cluster,
        wait_ready,
    )

    start_local_cluster()
    import ray
    from ray import serve

    try:
        cfg = load_config(Path("deployment/configs/local.yaml"))
        deploy(
            cfg,
            {
                "max_grammar_properties": 1 << 20,
                "max_grammar_bytes": 1 << 24,
                "max_grammar_compile_s": 600.0,
            },
        )
        url = f"http://127.0.0.1:{cfg['http_options']['port']}"
        wait_ready(url)
        plain = [{"prompt": f"Tell me a story, take {i}:", **PLAIN} for i in range(ns.plain)]
        timed_post(url, plain[0])  # warm up
        with ThreadPoolExecutor(ns.plain) as pool:
            alone = [t for _, t in pool.map(lambda b: timed_post(url, b), plain)]
        props = {f"field_{i}": {"type": "string"} for i in range(ns.properties)}
        attack = {
            "prompt": "JSON please:",
            "max_tokens": 8,
            "dp_rank": 0,
            "guided_json": {"type": "object", "properties": props},
        }
        with ThreadPoolExecutor(ns.plain + 1) as pool:
            grammar = pool.submit(timed_post, url, attack)
            time.sleep(0.5)  # the compile is under way
            beside = [t for _, t in pool.map(lambda b: timed_post(url, b), plain)]
            status, compile_s = grammar.result()
        print(
            f"{ns.plain} plain 32-token completions on rank 0: alone median "
            f"{statistics.median(alone):.2f} s (max {max(alone):.2f}); beside a "
            f"{ns.properties}-property schema compiling there: median "
            f"{statistics.median(beside):.2f} s (max {max(beside):.2f}); the schema's request "
            f"answered {status} after {compile_s:.1f} s"
        )
    finally:
        shutdown(serve, ray)


if __name__ == "__main__":
    main()
