"""The comparison matrix: workloads x routers x load, every policy, on the calibrated preset.

    PYTHONPATH=. .venv/bin/python benchmarks/sim_matrix.py [--json docs/results/matrix.json]
        [--plot docs/img/matrix.png] [--num-requests 200]

Each cell runs every registered policy on the same seeded arrivals (dp=8, gb200-dsv3, mixed
prefill+decode batches as the calibrated vLLM setup) and checks the adaptive gate's targets:
no peer better on both TTFT p99 and ITL p50; TTFT p99 <= none's + the TTFT budget; ITL p50
<= 1.05 x the best peer's; throughput >= 0.98 x the best peer's. It prints one markdown
table per cell group and writes everything as JSON (and a plot of the auto gate's ratios).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from roundgate.actors.server_args import ServerArgs
from roundgate.gate import registry
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import RouterSpec
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.workload import WorkloadSpec, generate

DP = 8
# (input, output, length_dist, light rate, heavy rate): heavy is near each workload's knee on
# this preset, light well below it.
WORKLOADS = {
    "chat": (230, 200, "uniform", 8.0, 40.0),
    "agentic": (8596, 182, "uniform", 0.5, 2.0),
    "reasoning": (803, 3654, "uniform", 1.0, 4.0),
    "vllm-44558-A": (1000, 200, "fixed", 12.0, 24.0),
}
ROUTERS = {
    "round-robin": ("round-robin", None),
    "least-loaded": ("least-loaded", None),
    "skewed 8:1": ("skewed", (8, 1, 1, 1, 1, 1, 1, 1)),
}
AUTO = "roundgate-auto"
METRICS = ("output_tokens_per_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "decode_frac")


def cell_summary(summary: dict) -> dict:
    return {
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "ttft_p50": summary["ttft_ms"]["p50"],
        "ttft_p99": summary["ttft_ms"]["p99"],
        "itl_p50": summary["itl_ms"]["p50"],
        "itl_p99": summary["itl_ms"]["p99"],
        "decode_frac": summary["decode_round_fraction"],
        "unfinished": summary["unfinished"],
    }


def run_cell(workload: str, router: str, load: str, num_requests: int) -> dict:
    inp, out, dist, light, heavy = WORKLOADS[workload]
    rate = light if load == "light" else heavy
    n = max(40, num_requests * 200 // max(200, out))  # long outputs: fewer requests
    spec = WorkloadSpec(
        num_requests=n, rate=rate, input_len=inp, output_len=out, length_dist=dist, seed=0
    )
    arrivals = tuple(generate(spec))  # one draw, every policy
    name, weights = ROUTERS[router]
    results = {}
    for policy in registry.names():
        flags = registry.comparison_flags(policy, {})
        args = ServerArgs(
            dp_size=DP,
            max_num_seqs=1024 * DP,
            max_scheduled_tokens=8192,
            page_size=64,
            num_kv_pages=8192,
            enable_mixed_prefill_decode=True,
            enable_prefix_caching=False,  # synthetic prompts share no prefix
            prefill_policy=policy,
            **flags,
        )
        run = SimSpec(args, arrivals, PRESETS["gb200-dsv3"], RouterSpec(name, weights))
        results[policy] = cell_summary(summarize(simulate(run)))
    budget = registry.comparison_flags(AUTO, {})["prefill_max_wait_ms"]
    return {
        "workload": workload,
        "router": router,
        "load": load,
        "rate": rate,
        "num_requests": n,
        "policies": results,
        "targets": targets(results, budget),
    }


def targets(results: dict, budget: float) -> dict:
    """The auto gate's four targets in this cell, each True/False with the peer it names."""
    auto = results[AUTO]
    peers = {p: r for p, r in results.items() if p not in (AUTO, "roundgate")}
    dominated_by = [
        p
        for p, r in peers.items()
        if r["ttft_p99"] < auto["ttft_p99"] and r["itl_p50"] < auto["itl_p50"]
    ]
    best_itl = min(r["itl_p50"] for r in peers.values())
    best_tps = max(r["output_tokens_per_s"] for r in peers.values())
    return {
        "no_peer_better_on_both": not dominated_by,
        "dominated_by": dominated_by,
        "ttft_p99_within_budget": auto["ttft_p99"] <= results["none"]["ttft_p99"] + budget,
        "itl_p50_within_5pct": auto["itl_p50"] <= 1.05 * best_itl,
        "throughput_within_2pct": auto["output_tokens_per_s"] >= 0.98 * best_tps,
    }


def markdown(cells: list[dict]) -> str:
    lines = [
        "| workload | router | load | policy | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | "
        "ITL p99 | decode frac |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cell in cells:
        for policy, r in cell["policies"].items():
            lines.append(
                f"| {cell['workload']} | {cell['router']} | {cell['load']} | {policy} | "
                f"{r['output_tokens_per_s']:.0f} | {r['ttft_p50']:.0f} | {r['ttft_p99']:.0f} | "
                f"{r['itl_p50']:.1f} | {r['itl_p99']:.1f} | {r['decode_frac']:.3f} |"
            )
    return "\n".join(lines)


MISS_LABELS = {
    "ttft_p99_within_budget": "TTFT p99 > none's + budget",
    "itl_p50_within_5pct": "ITL p50 > 1.05× best",
    "throughput_within_2pct": "tok/s < 0.98× best",
}


def _rate(rate: float) -> str:
    return f"{rate:g}/s"


def summary_table(cells: list[dict]) -> str:
    """The docs' table (docs/simulator.md): the adaptive gate, ``none`` and the best peer per
    cell, and the targets missed."""
    lines = [
        "| workload | router | load | auto: TTFT p99 / ITL p50 / tok/s / decode frac | "
        "none: TTFT p99 / ITL p50 / tok/s | best peer ITL p50 (who) | best peer tok/s (who) | "
        "targets missed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in cells:
        res, t = c["policies"], c["targets"]
        auto, none = res[AUTO], res["none"]
        peers = {p: r for p, r in res.items() if p not in (AUTO, "roundgate")}
        itl_who = min(peers, key=lambda p: peers[p]["itl_p50"])
        tps_who = max(peers, key=lambda p: peers[p]["output_tokens_per_s"])
        missed = []
        if t["dominated_by"]:
            missed.append(f"dominated ({', '.join(t['dominated_by'])})")
        missed += [label for key, label in MISS_LABELS.items() if t[key] is False]
        lines.append(
            f"| {c['workload']} | {c['router']} | {c['load']} ({_rate(c['rate'])}) | "
            f"{auto['ttft_p99']:,.0f} / {auto['itl_p50']:.1f} / "
            f"{auto['output_tokens_per_s']:,.0f} / {auto['decode_frac']:.2f} | "
            f"{none['ttft_p99']:,.0f} / {none['itl_p50']:.1f} / "
            f"{none['output_tokens_per_s']:,.0f} | "
            f"{peers[itl_who]['itl_p50']:.1f} ({itl_who}) | "
            f"{peers[tps_who]['output_tokens_per_s']:,.0f} ({tps_who}) | "
            f"{'; '.join(missed) or '—'} |"
        )
    return "\n".join(lines)


def plot(cells: list[dict], path: Path) -> None:
    """The auto gate over the best peer per cell: TTFT p99, ITL p50, throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c['workload']}\n{c['router']}\n{c['load']}" for c in cells]
    series = {"TTFT p99": [], "ITL p50": [], "out tok/s": []}
    for c in cells:
        res = c["policies"]
        peers = [r for p, r in res.items() if p not in (AUTO, "roundgate")]
        auto = res[AUTO]
        series["TTFT p99"].append(auto["ttft_p99"] / min(r["ttft_p99"] for r in peers))
        series["ITL p50"].append(auto["itl_p50"] / min(r["itl_p50"] for r in peers))
        series["out tok/s"].append(
            auto["output_tokens_per_s"] / max(r["output_tokens_per_s"] for r in peers)
        )
    fig, ax = plt.subplots(figsize=(14, 4.5), dpi=100)
    width = 0.27
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + (i - 1) * width for x in range(len(cells))], values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(cells)), labels, fontsize=6)
    ax.set_ylabel("roundgate-auto / best peer")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--table-from",
        type=Path,
        default=None,
        help="print the docs' summary table of a matrix JSON written before, and stop",
    )
    ns = parser.parse_args()
    if ns.table_from is not None:
        print(summary_table(json.loads(ns.table_from.read_text())["cells"]))
        return
    cells = []
    for workload in ns.workloads.split(","):
        for router in ROUTERS:
            for load in ("light", "heavy"):
                cells.append(run_cell(workload, router, load, ns.num_requests))
                print(f"done {workload} {router} {load}", flush=True)
    print(markdown(cells))
    print(summary_table(cells))
    for cell in cells:
        missed = [k for k, v in cell["targets"].items() if v is False]
        if missed:
            print(
                f"MISS {cell['workload']} / {cell['router']} / {cell['load']}: {missed} "
                f"(dominated by {cell['targets']['dominated_by']})"
            )
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(
            json.dumps(
                {"dp_size": DP, "costs": "gb200-dsv3", "cells": cells}, indent=2, sort_keys=True
            )
            + "\n"
        )
    if ns.plot is not None:
        plot(cells, ns.plot)


if __name__ == "__main__":
    main()
