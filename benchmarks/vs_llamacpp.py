"""The CPU engine against llama.cpp's server: the same GGUF file, the same cores, the same
client (``roundgate bench --url ...``), one server at a time.

    .venv/bin/python benchmarks/vs_llamacpp.py [--threads 2] [--concurrency 1 4 8 16]
        [--runs llamacpp llamacpp-1t ours-dp2 ours-dp2-int8 ours-dp1 ours-dp2-nogate]

Servers (``--runs``): ``llamacpp``, llama.cpp's server from ``.venv-llamacpp`` (``make
llamacpp``) on the default model's GGUF with ``--threads`` threads and one slot per concurrent
request, and ``llamacpp-1t`` with one thread (batch 1 only: the per-thread figure that one of
our dp2 ranks, one thread each, is compared with); ``ours-dp2``,
``deployment/configs/local.yaml`` (two ranks of one thread each, the gate on);
``ours-dp1``, ``local-dp1.yaml`` (one rank, both threads); the ``-int8`` variants run
``--gguf-weights int8-dot``; ``-nogate`` runs ``--prefill-policy none`` at concurrency 8 only
(what the gate does to inter-token latency under load).

Per server: one request with a 256-token prompt and 64 output tokens, three times
(prefill tok/s = 256 / TTFT, decode tok/s = 1 / TPOT; medians), then closed-loop runs at each
``--concurrency`` (2 x concurrency requests, 256/64, random-id prompts, ``ignore_eos``; output
tok/s and ITL p50/p99). llama.cpp's prompt cache is off and every run draws fresh prompts.
Prints one table with the machine and thread counts; ``--json`` keeps every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from common import REPO, serve_config, stop, wait_ready

from roundgate.bench.cli import policy_overrides
from roundgate.bench.llamacpp import LLAMACPP_PYTHON, llamacpp_command

PORT = 18771
# run name -> (config file, overrides of its args); llamacpp is not one of ours.
OURS = {
    "ours-dp2": ("local.yaml", {}),
    "ours-dp1": ("local-dp1.yaml", {}),
    "ours-dp1-int8": ("local-dp1.yaml", {"gguf_weights": "int8-dot"}),
    "ours-dp2-int8": ("local.yaml", {"gguf_weights": "int8-dot"}),
    "ours-dp2-nogate": ("local.yaml", {"prefill_policy": "none"}),
}
LLAMACPP = {"llamacpp", "llamacpp-1t"}
# Runs that measure only some concurrency levels (None: all of --concurrency).
LEVELS = {"llamacpp-1t": [], "ours-dp2-nogate": [8]}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def start_llamacpp(threads: int, slots: int) -> subprocess.Popen:
    if not LLAMACPP_PYTHON.exists():
        raise SystemExit(f"{LLAMACPP_PYTHON} is missing: run `make llamacpp`")
    command = llamacpp_command(PORT, threads, slots=slots)
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_ours(name: str, folder: Path) -> subprocess.Popen:
    config, overrides = OURS[name]
    cfg = yaml.safe_load((REPO / "deployment" / "configs" / config).read_text())
    cfg["http_options"]["port"] = PORT
    args = cfg["applications"][0]["args"]
    if "prefill_policy" in overrides:  # the other policies' flags unset, as bench --compare
        overrides = {**policy_overrides(overrides["prefill_policy"], args), **overrides}
    args.update(overrides)
    return serve_config(cfg, folder / f"{name}.yaml")


def bench(url: str, concurrency: int, requests: int, seed: int, folder: Path) -> dict[str, Any]:
    out = folder / f"bench-{concurrency}-{seed}.json"
    command = [
        sys.executable,
        "-m",
        "roundgate.cli.main",
        "bench",
        "--url",
        url,
        "--concurrency",
        str(concurrency),
        "--num-requests",
        str(requests),
        "--input-len",
        "256",
        "--output-len",
        "64",
        "--seed",
        str(seed),
        "--json",
        str(out),
        "--no-progress",
    ]
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if not out.exists():  # bench exits non-zero when requests fail, yet writes its report
        raise RuntimeError(f"roundgate bench failed: {done.stderr.decode()[-500:]}")
    return json.loads(out.read_text())["results"]["bench"]


def measure(url: str, levels: list[int], folder: Path, seed: int) -> dict[str, Any]:
    """Batch-1 prefill and decode (medians of three single requests, after two warm-up
    requests: one to each rank of a dp=2 deployment), then each level."""
    bench(url, 1, 2, seed + 50, folder)
    singles = [bench(url, 1, 1, seed + i, folder) for i in range(3)]
    ttft = statistics.median(s["ttft_ms"]["p50"] for s in singles)
    tpot = statistics.median(s["tpot_ms"]["p50"] for s in singles)
    row: dict[str, Any] = {"prefill_tok_s": 256 / (ttft / 1000), "decode_tok_s": 1000 / tpot}
    for c in levels:
        s = bench(url, c, max(4, 2 * c), seed + 100 + c, folder)
        row[f"c{c}"] = {
            "out_tok_s": s["output_tokens_per_s"],
            "itl_p50": s["itl_ms"]["p50"],
            "itl_p99": s["itl_ms"]["p99"],
            "errors": s.get("errors", {}),
        }
    return row


def table(results: dict[str, dict[str, Any]], levels: list[int], threads: int) -> str:
    lines = [
        f"machine: {cpu_name()}, {os.cpu_count()} cores; llama.cpp {threads} threads; "
        "ours dp2 = 2 ranks x 1 thread, dp1 = 1 rank x 2 threads",
        "prompt 256 tokens, 64 output tokens, random-id prompts, ignore_eos",
        "",
    ]
    header = ["run", "prefill tok/s", "decode tok/s"]
    for c in levels:
        header += [f"c{c} out tok/s", f"c{c} ITL p50", f"c{c} ITL p99"]
    rows = [header]
    for name, r in results.items():
        row = [name, f"{r['prefill_tok_s']:.0f}", f"{r['decode_tok_s']:.1f}"]
        for c in levels:
            level = r.get(f"c{c}")
            if level is None:  # a run that measured only some levels
                row += ["-", "-", "-"]
                continue
            row += [
                f"{level['out_tok_s']:.1f}",
                f"{level['itl_p50']:.0f}",
                f"{level['itl_p99']:.0f}",
            ]
        rows.append(row)
    lines.append("| " + " | ".join(rows[0]) + " |")
    lines.append("|" + "---|" * len(rows[0]))
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument(
        "--runs",
        nargs="+",
        default=[
            "llamacpp",
            "llamacpp-1t",
            "ours-dp2",
            "ours-dp2-int8",
            "ours-dp1",
            "ours-dp2-nogate",
        ],
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    unknown = [r for r in args.runs if r not in LLAMACPP and r not in OURS]
    if unknown:
        choices = ", ".join([*sorted(LLAMACPP), *OURS])
        parser.error(f"--runs: unknown {unknown}; choose from {choices}")
    url = f"http://127.0.0.1:{PORT}"
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i, name in enumerate(args.runs):
            if name in LLAMACPP:
                threads = 1 if name == "llamacpp-1t" else args.threads
                process = start_llamacpp(threads, max(args.concurrency))
            else:
                process = start_ours(name, folder)
            try:
                wait_ready(url, process)
                # Fresh prompts per server: no run is served from another's cache.
                levels = LEVELS.get(name, args.concurrency)
                results[name] = measure(url, levels, folder, args.seed + 1000 * i)
            except RuntimeError as exc:  # one server's failure leaves the others' figures
                print(f"{name}: {exc}", file=sys.stderr, flush=True)
                continue
            finally:
                stop(process)
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    print(table(results, args.concurrency, args.threads))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
