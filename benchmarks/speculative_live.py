"""Speculative decoding live: n-gram drafts on local.yaml's deployment against none, and
llama.cpp's own n-gram speculation on the same GGUF, cores and prompts.

    .venv/bin/python benchmarks/speculative_live.py [--runs off k2 k4 llamacpp llamacpp-k4]
        [--max-tokens 256] [--threads 2] [--repeats 3] [--logs DIR]

Servers, one at a time, each on a port of its own: ``off``, ``k2``, ``k4``: ``deployment/configs/
local.yaml`` (SmolLM2-135M-Instruct, two ranks of one thread each, the gate on) with
``speculative_config`` unset or ``{"method": "ngram", "num_speculative_tokens": K,
"prompt_lookup_min": 2, "prompt_lookup_max": 5}``; ``llamacpp`` and ``llamacpp-kK``:
llama.cpp's server from ``.venv-llamacpp`` (``make llamacpp``) with ``--threads`` threads and
8 slots of 1,024 tokens, without and with its ``ngram_simple`` speculation (K drafts).

Workloads, chat completions through each server's chat template, greedy, ``max_tokens``
output tokens, the same prompts for every server:

- ``copy``: "rewrite this module with one change" (rename one of its eight short functions),
  the module in the prompt: answers that repeat most of their prompt;
- ``chat``: eight open questions: little to copy.

Each workload runs at concurrency 1 (three requests, one after another) and 8 (eight at
once), after one warm-up request per rank, ``--repeats`` times in turn (3). Reported per
server, workload and concurrency, from the median run by output tok/s: output tok/s (output
tokens over the wall time of the run) and ITL p50 over requests, where a request's ITL is
``(last token time - first token time) / (tokens - 1)``. Prints one table; ``--json`` keeps
every run's tok/s too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from common import REPO, serve_config, stop, wait_ready

from roundgate.bench.llamacpp import LLAMACPP_PYTHON, llamacpp_command

PORT = 18772
MODEL = "smollm2-135m-instruct"
FUNCTIONS = [
    "def area(width, height):\n    return width * height",
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    return total / len(values)",
    "def is_even(n):\n    return n % 2 == 0",
    "def greet(name):\n    message = 'Hello, ' + name\n    print(message)\n    return message",
    "def clamp(x, low, high):\n    if x < low:\n        return low\n    if x > high:\n"
    "        return high\n    return x",
    "def count_words(text):\n    words = text.split()\n    return len(words)",
    "def reverse(items):\n    out = []\n    for item in reversed(items):\n"
    "        out.append(item)\n    return out",
    "def fahrenheit(celsius):\n    return celsius * 9 / 5 + 32",
]
MODULE = "\n\n".join(FUNCTIONS)
COPY = [
    f"Here is a Python module:\n\n```python\n{MODULE}\n```\n\nRewrite the module with one "
    f"change: rename the function `{name}` to `{name}_v2`. Output the whole module."
    for name in (f.split("(")[0].removeprefix("def ") for f in FUNCTIONS)
]
CHAT = [
    "Why is the sky blue?",
    "Give me three tips for learning a new language.",
    "What makes a good breakfast?",
    "Describe a walk in a forest in autumn.",
    "How do bees make honey?",
    "What should I pack for a weekend trip?",
    "Explain what a computer does, simply.",
    "Tell me a short story about a cat.",
]
WORKLOADS = {"copy": COPY, "chat": CHAT}
OURS = {"off": None, "k2": 2, "k4": 4}


def start(run: str, port: int, threads: int, folder: Path) -> subprocess.Popen:
    if run.startswith("llamacpp"):
        if not LLAMACPP_PYTHON.exists():
            raise SystemExit(f"{LLAMACPP_PYTHON} is missing: run `make llamacpp`")
        k = int(run.split("-k")[1]) if "-k" in run else 0
        # 1,024 tokens a slot: a copy prompt (~270 tokens) and its answer fit.
        command = llamacpp_command(port, threads, slots=8, spec_ngram=k, ctx_per_slot=1024)
        log = (folder / f"{run}.log").open("w")
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    cfg = yaml.safe_load((REPO / "deployment" / "configs" / "local.yaml").read_text())
    cfg["http_options"]["port"] = port
    k = OURS[run]
    if k is not None:
        cfg["applications"][0]["args"]["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
        }
    return serve_config(cfg, folder / f"{run}.yaml")


async def one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat completion: token times (a chunk of n tokens: n times)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    times: list[float] = []
    tokens = 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            now = time.perf_counter()
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    times.append(now)
    # Chunks carry whole tokens; spread the usage count over the content chunks' times.
    return {
        "tokens": tokens,
        "first": times[0] if times else None,
        "last": times[-1] if times else None,
    }


def itl(result: dict) -> float | None:
    if result["tokens"] < 2 or result["first"] is None:
        return None
    return (result["last"] - result["first"]) / (result["tokens"] - 1)


async def workload(url: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    # No kept-alive connections: llama.cpp's HTTP server closes one after a few requests, and
    # a request sent on it as it closes is lost ("Server disconnected").
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        started = time.perf_counter()
        if concurrency == 1:
            results = [await one(client, url, p, max_tokens) for p in prompts[:3]]
        else:
            results = await asyncio.gather(
                *(one(client, url, p, max_tokens) for p in prompts[:concurrency])
            )
        wall = time.perf_counter() - started
    gaps = [g for g in (itl(r) for r in results) if g is not None]
    tokens = sum(r["tokens"] for r in results)
    return {
        "out_tok_s": tokens / wall,
        "itl_p50_ms": 1000 * statistics.median(gaps) if gaps else None,
        "tokens": tokens,
    }


def measure(url: str, max_tokens: int, repeats: int) -> dict[str, Any]:
    """Each workload and concurrency ``repeats`` times in turn; the median run of each (by
    output tok/s) is kept, every run's figure beside it."""
    asyncio.run(workload(url, CHAT, 2, 8))  # warm-up: one request per rank
    runs: dict[str, list[dict]] = {}
    for _ in range(repeats):
        for name, prompts in WORKLOADS.items():
            for c in (1, 8):
                run = asyncio.run(workload(url, prompts, c, max_tokens))
                runs.setdefault(f"{name}-c{c}", []).append(run)
    row: dict[str, Any] = {}
    for cell, results in runs.items():
        ordered = sorted(results, key=lambda r: r["out_tok_s"])
        row[cell] = ordered[len(ordered) // 2] | {"runs": [r["out_tok_s"] for r in results]}
    return row


def table(results: dict[str, dict[str, Any]]) -> str:
    cells = [f"{w}-c{c}" for w in WORKLOADS for c in (1, 8)]
    head = "| server | " + " | ".join(f"{c} tok/s | {c} ITL p50 ms" for c in cells) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(cells))]
    for run, row in results.items():
        parts = []
        for c in cells:
            m = row[c]
            itl_ms = "-" if m["itl_p50_ms"] is None else f"{m['itl_p50_ms']:.1f}"
            parts.append(f"{m['out_tok_s']:.1f} | {itl_ms}")
        lines.append(f"| {run} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", default=["off", "k2", "k4", "llamacpp", "llamacpp-k4"])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each cell (median)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--logs", type=Path, default=None, help="keep the servers' logs here")
    ns = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = ns.logs or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for i, run in enumerate(ns.runs):
            # A port per server: one stopping may still hold its port a while.
            url = f"http://127.0.0.1:{PORT + i}"
            process = start(run, PORT + i, ns.threads, folder)
            try:
                wait_ready(url, process)
                results[run] = measure(url, ns.max_tokens, ns.repeats)
            finally:
                stop(process)
            print(f"{run}: {json.dumps(results[run])}", flush=True)
    print(table(results))
    if ns.json:
        ns.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
