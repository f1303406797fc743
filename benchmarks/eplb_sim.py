"""Static expert placement vs EPLB in the simulator, at dp 8, 32 and 128 (DeepSeek-V3 preset).

    PYTHONPATH=. .venv/bin/python benchmarks/eplb_sim.py [--costs h100-dsv3]
        [--requests-per-rank 48] [--concurrency-per-rank 16] [--json out.json]

Every arm of one dp runs the same seeded closed-loop workload (``concurrency-per-rank x dp``
clients, all admitted: throughput follows the round time) with the same expert popularity
(log-normal, ``--expert-skew`` 0.5, drifting ``--expert-drift`` 0.005 a round) and differs
only in where the experts sit:

- ``mean load``: the preset's price, every rank at the mean expert load (the ceiling);
- ``static``: contiguous blocks, one copy of each expert;
- ``eplb R=0``: re-placed every ``--eplb-interval-rounds`` from the last window's load;
- ``eplb R=dp``: the same with one redundant slot per rank.

The rebalance interval and window are scaled down from the engine's defaults (3000/1000
rounds) to fit a run of a few hundred rounds; the rebalance pause is 0 (the weight moves are
priced elsewhere). Prints one markdown table (output tokens/s, ITL p50/p99, mean
balancedness, rebalances).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from roundgate.cli.main import build_parser
from roundgate.sim.options import sim_specs
from roundgate.sim.report import summarize
from roundgate.sim.spec import simulate

DP_SIZES = (8, 32, 128)
INTERVAL, WINDOW = 100, 100


def arms(dp: int) -> dict[str, list[str]]:
    """The flags of each placement arm at ``dp`` ranks."""
    eplb = ["--expert-placement", "eplb", "--eplb-interval-rounds", str(INTERVAL),
            "--eplb-window-rounds", str(WINDOW)]  # fmt: skip
    return {
        "mean load": [],
        "static": ["--expert-placement", "static"],
        "eplb R=0": eplb,
        f"eplb R={dp}": [*eplb, "--num-redundant-experts", str(dp)],
    }


def run(dp: int, flags: list[str], costs: str, per_rank: int, concurrency: int) -> dict:
    argv = [
        "simulate", "--costs", costs, "--dp-size", str(dp),
        "--num-requests", str(per_rank * dp), "--concurrency", str(concurrency * dp),
        "--max-num-seqs", str(concurrency * dp),
        "--input-len", "1000", "--output-len", "200", "--length-dist", "uniform",
        "--no-progress", *flags,
    ]  # fmt: skip
    (spec,) = sim_specs(build_parser().parse_args(argv))
    start = time.perf_counter()
    summary = summarize(simulate(spec))
    summary["wall_s"] = round(time.perf_counter() - start, 2)
    return summary


def row(dp: int, arm: str, s: dict) -> str:
    experts = s.get("experts")
    balance = "1 (assumed)" if experts is None else f"{experts['mean_balancedness']:.3f}"
    rebalances = "-" if experts is None else str(experts["rebalances"])
    return (
        f"| {dp} | {arm} | {s['output_tokens_per_s']:.0f} | {s['itl_ms']['p50']:.2f} | "
        f"{s['itl_ms']['p99']:.2f} | {balance} | {rebalances} | {s['wall_s']} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--costs", default="h100-dsv3")
    p.add_argument("--requests-per-rank", type=int, default=48)
    p.add_argument("--concurrency-per-rank", type=int, default=16)
    p.add_argument("--json", type=Path, default=None)
    ns = p.parse_args()
    print("| dp | placement | out tok/s | ITL p50 ms | ITL p99 ms | mean balancedness | "
          "rebalances | wall s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    results: dict[str, dict[str, dict]] = {}
    for dp in DP_SIZES:
        for arm, flags in arms(dp).items():
            summary = run(dp, flags, ns.costs, ns.requests_per_rank, ns.concurrency_per_rank)
            results.setdefault(str(dp), {})[arm] = summary
            print(row(dp, arm, summary), flush=True)
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
