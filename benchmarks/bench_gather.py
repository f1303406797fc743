"""Where a dp=2 group's per-round all-gather waits, bare and served.

    .venv/bin/python benchmarks/bench_gather.py bare [--rounds 300] [--compute-ms 20]
        [--form list|tensor|torch-gather] [--nice 0] [--busy-python-ms 0]
    .venv/bin/python benchmarks/bench_gather.py served [--repeats 5] [--runs dp2 dp1-1t]
        [--env RAY_worker_niceness=0]

``bare``: two processes join a gloo group on 127.0.0.1 as two rank replicas do. The busy one
computes ``--compute-ms`` (torch ops, as a decode forward) and then all-gathers one row; the
idle one loops on the all-gather, as the idle rank of a group with one request does. Prints
the busy side's all-gather median and p90. Knobs for the hypotheses: ``--form``
(``dist.all_gather`` into a list, or into one tensor: ``all_gather_single``, formerly
``all_gather_into_tensor``; or ``torch-gather``: the ranks' own ``TorchGather``, tuple in,
tuples out, with its host reads), ``--nice`` (both processes; Ray runs workers at 15),
``--busy-python-ms`` (a second thread of the busy process runs that much pure Python from the
moment the gather starts, as the replica's event loop relaying a token does: it holds the GIL
the gathering thread needs to return).

``served``: starts ``roundgate serve`` on each config in turn (``dp2``: ``local.yaml``, two
ranks of one thread, every request pinned to rank 0; ``dp1-1t``: ``local-dp1.yaml`` with one
thread, ``num_cpus_per_rank: 1.0``), runs ``roundgate bench --concurrency 1`` (one request,
256-token prompt, 64 output tokens) ``--repeats`` times after one warm-up request, and reports
the median TPOT and ITL p50, and per rank the round parts' mean
(``roundgate_round_part_duration_seconds``, the increase over the runs) with the ``gather``
part's share of rounds per bucket: rank 0 is the busy rank, rank 1 the idle one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import join_pair, run_pair, serve_config, stop, wait_ready

REPO = Path(__file__).resolve().parents[1]
PORT = 18773
ROW_COLUMNS = 12  # a wide row: the five gate columns and a policy's extras


# ---- bare ---------------------------------------------------------------------------------


def spin_python(seconds: float) -> None:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1


def bare_worker(rank: int, port: int, ns: argparse.Namespace, out: Any) -> None:
    import torch
    import torch.distributed as dist

    if ns.nice:
        os.nice(ns.nice)
    join_pair(rank, port)
    row = torch.arange(ROW_COLUMNS, dtype=torch.int64)
    flat = torch.empty(2 * ROW_COLUMNS, dtype=torch.int64)
    rows = [torch.empty_like(row) for _ in range(2)]
    own = None
    if ns.form == "torch-gather":
        from roundgate.actors.replica.torch_gather import TorchGather

        own, packed = TorchGather(), tuple(range(ROW_COLUMNS))

    def gather() -> list[tuple[int, ...]]:
        if own is not None:
            return own.all_gather(packed)
        if ns.form == "tensor":  # all_gather_into_tensor, renamed in torch 2.13
            getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(flat, row)
            return [tuple(r) for r in flat.view(2, ROW_COLUMNS).tolist()]
        dist.all_gather(rows, row)
        return [tuple(t.tolist()) for t in rows]

    go = threading.Event()
    stop = threading.Event()

    def busy_python() -> None:  # the replica's asyncio loop relaying a token
        while not stop.is_set():
            if go.wait(0.1):
                go.clear()
                spin_python(ns.busy_python_ms / 1e3)

    helper = None
    if rank == 0 and ns.busy_python_ms > 0:
        helper = threading.Thread(target=busy_python, daemon=True)
        helper.start()
    a = torch.randn(64, 576)
    w = torch.randn(576, 576)
    times: list[float] = []
    for i in range(ns.rounds + ns.warmup):
        if rank == 0:
            end = time.perf_counter() + ns.compute_ms / 1e3
            while time.perf_counter() < end:
                torch.mm(a, w)
            go.set()
        t = time.perf_counter()
        gather()
        if i >= ns.warmup:
            times.append(time.perf_counter() - t)
    stop.set()
    out.put((rank, times))
    dist.destroy_process_group()


def bare(ns: argparse.Namespace) -> dict[str, Any]:
    results = run_pair(bare_worker, ns, timeout_s=900)
    busy = sorted(t * 1e3 for t in results[0])
    return {
        "form": ns.form,
        "nice": ns.nice,
        "busy_python_ms": ns.busy_python_ms,
        "compute_ms": ns.compute_ms,
        "rounds": len(busy),
        "busy_gather_median_ms": statistics.median(busy),
        "busy_gather_p90_ms": busy[int(len(busy) * 0.9)],
    }


# ---- served -------------------------------------------------------------------------------

# run name -> (config file, overrides of its args, --pin-weights: every request on rank 0,
# so rank 0 is the busy rank and rank 1 the idle one)
SERVED = {
    "dp2": ("local.yaml", {}, "1,0"),
    "dp1-1t": ("local-dp1.yaml", {"num_cpus_per_rank": 1.0}, None),
}
_SERIES = re.compile(
    r"^roundgate_round_part_duration_seconds_(?P<kind>bucket|sum)"
    r"\{(?P<labels>[^}]*)\} (?P<value>\S+)$"
)


def start_server(name: str, folder: Path, env: dict[str, str]) -> subprocess.Popen:
    import yaml

    config, overrides, _ = SERVED[name]
    cfg = yaml.safe_load((REPO / "deployment" / "configs" / config).read_text())
    cfg["http_options"]["port"] = PORT
    cfg["applications"][0]["args"].update(overrides)
    return serve_config(cfg, folder / f"{name}.yaml", env)


def bench_once(
    url: str, seed: int, folder: Path, pin: str | None, concurrency: int = 1
) -> dict[str, Any]:
    out = folder / f"bench-{seed}.json"
    num_requests = 1 if concurrency == 1 else 2 * concurrency
    command = [
        sys.executable, "-m", "roundgate.cli.main", "bench", "--url", url,
        "--concurrency", str(concurrency), "--num-requests", str(num_requests),
        "--input-len", "256", "--output-len", "64",
        "--seed", str(seed), "--json", str(out), "--no-progress",
    ]  # fmt: skip
    if pin is not None:
        command += ["--pin-weights", pin]
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if not out.exists():
        raise RuntimeError(f"roundgate bench failed: {done.stderr.decode()[-500:]}")
    return json.loads(out.read_text())["results"]["bench"]


def round_parts(url: str) -> dict[tuple[str, str], dict[float, float]]:
    """Per (rank, part): the round part's cumulative histogram, ``le`` -> count (``-1``: the
    sum of seconds)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    series: dict[tuple[str, str], dict[float, float]] = {}
    for line in text.splitlines():
        m = _SERIES.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        if m["kind"] == "sum":
            le = -1.0
        else:
            le = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
        series.setdefault((labels.get("dp_rank", "?"), labels["part"]), {})[le] = float(m["value"])
    return series


def histogram_summary(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """The rounds between two scrapes: count, median bucket bound, share per bucket (ms)."""
    les = sorted(le for le in after if le >= 0)
    counts = [after[le] - before.get(le, 0.0) for le in les]
    total = counts[-1]
    if total <= 0:
        return {"rounds": 0}
    mean_ms = (after.get(-1.0, 0.0) - before.get(-1.0, 0.0)) / total * 1e3
    share, prev, median = {}, 0.0, None
    for le, cum in zip(les, counts, strict=True):
        if cum - prev > 0:
            share[f"<={le * 1e3:g}ms"] = round((cum - prev) / total, 3)
        if median is None and cum >= total / 2:
            median = le * 1e3
        prev = cum
    return {"rounds": int(total), "mean_ms": mean_ms, "median_bucket_ms": median, "share": share}


def served_run(name: str, ns: argparse.Namespace, folder: Path) -> dict[str, Any]:
    url = f"http://127.0.0.1:{PORT}"
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    env.update(item.split("=", 1) for item in ns.env)
    process = start_server(name, folder, env)
    try:
        wait_ready(url, process)
        pin = SERVED[name][2]
        bench_once(url, 999, folder, pin)  # warm-up: first-request costs out of the figures
        time.sleep(2)  # the metrics push interval: the warm-up's rounds are in the scrape
        before = round_parts(url)
        runs = [bench_once(url, ns.seed + i, folder, pin) for i in range(ns.repeats)]
        time.sleep(2)
        after = round_parts(url)
        if ns.concurrency > 1:  # both ranks busy (the outbox sends at once); after the scrape
            loaded = bench_once(url, ns.seed + 100, folder, None, ns.concurrency)
    finally:
        stop(process)
    result: dict[str, Any] = (
        {}
        if ns.concurrency == 1
        else {
            f"c{ns.concurrency}": {
                "out_tok_s": loaded["output_tokens_per_s"],
                "itl_p50_ms": loaded["itl_ms"]["p50"],
                "itl_p99_ms": loaded["itl_ms"]["p99"],
            }
        }
    )
    result |= {
        "tpot_ms": [r["tpot_ms"]["p50"] for r in runs],
        "tpot_median_ms": statistics.median(r["tpot_ms"]["p50"] for r in runs),
        "ttft_median_ms": statistics.median(r["ttft_ms"]["p50"] for r in runs),
        # The median gap between tokens: steadier than TPOT (a mean) on a shared machine.
        "itl_p50_ms": [r["itl_ms"]["p50"] for r in runs],
        "itl_p50_median_ms": statistics.median(r["itl_ms"]["p50"] for r in runs),
    }
    for (rank, part), hist in sorted(after.items()):
        summary = histogram_summary(before.get((rank, part), {}), hist)
        if part == "gather":
            result.setdefault("gather_by_rank", {})[rank] = summary
        if summary["rounds"]:
            means = result.setdefault("part_mean_ms_by_rank", {}).setdefault(rank, {})
            means[part] = round(summary["mean_ms"], 3)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("bare", help="two gloo processes, no Ray")
    b.add_argument("--rounds", type=int, default=300)
    b.add_argument("--warmup", type=int, default=20)
    b.add_argument("--compute-ms", type=float, default=20.0)
    b.add_argument("--form", choices=("list", "tensor", "torch-gather"), default="list")
    b.add_argument("--nice", type=int, default=0, help="niceness of both processes")
    b.add_argument("--busy-python-ms", type=float, default=0.0)
    s = sub.add_parser("served", help="roundgate serve + roundgate bench, batch 1")
    s.add_argument("--runs", nargs="+", choices=tuple(SERVED), default=list(SERVED))
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument(
        "--concurrency", type=int, default=1, help="> 1: also one closed-loop run at this level"
    )
    s.add_argument(
        "--env", nargs="*", default=[], help="KEY=VALUE for the server, e.g. RAY_worker_niceness=0"
    )
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    ns = parser.parse_args(argv)
    if ns.mode == "bare":
        result: dict[str, Any] = bare(ns)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = {name: served_run(name, ns, Path(tmp)) for name in ns.runs}
    print(json.dumps(result, indent=2))
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
