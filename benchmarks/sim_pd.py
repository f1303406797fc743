"""P/D against the gate in the simulator: fused (none), fused + gate (roundgate) and P/D.

    PYTHONPATH=. .venv/bin/python benchmarks/sim_pd.py [--json docs/results/pd.json]
        [--num-requests 300] [--presets h100-dsv3,gb200-dsv3] [--prefill-ranks 2,4]

Each cell draws one seeded workload (the matrix's chat and agentic lengths and loads,
``benchmarks/sim_matrix.py``) and runs it three ways on the same GPUs: a fused group of P+8
ranks without a gate and with the gate, and P prefill ranks + 8 decode ranks (the roles'
control plane, ``roundgate.sim.disaggregated``) with the KV transfer cost swept over multiples of
the preset's sourced value (x0: free; x1: the preset's link; x10, x100: slower links). Per-rank
limits are the matrix's. It prints one markdown table per preset and workload and writes
everything as JSON. Every number is simulated; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from roundgate.actors.server_args import ServerArgs
from roundgate.sim.disaggregated import describe_transfers, simulate_pd
from roundgate.sim.options import policy_args
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS, RoundCosts
from roundgate.sim.router import RouterSpec
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.workload import WorkloadSpec, generate

DECODE_RANKS = 8
# (input, output, length_dist, light rate, heavy rate): the matrix's (sim_matrix.py).
WORKLOADS = {
    "chat": (230, 200, "uniform", 8.0, 40.0),
    "agentic": (8596, 182, "uniform", 0.5, 2.0),
}
MULTIPLIERS = (0, 1, 10, 100)
# KV bytes a token each preset's transfer cost was derived from (sim/round_costs.py).
KV_BYTES = {"h100-dsv3": 70_272, "gb200-dsv3": 40_016}


def fused_args(dp_size: int, policy: str) -> ServerArgs:
    return policy_args(
        policy,
        {},
        dp_size=dp_size,
        max_num_seqs=1024 * dp_size,
        max_scheduled_tokens=8192,
        page_size=64,
        num_kv_pages=8192,
        enable_mixed_prefill_decode=True,
        enable_prefix_caching=False,  # synthetic prompts share no prefix
    )


def row(label: str, summary: dict) -> dict:
    return {
        "arm": label,
        "out_tok_s": summary["output_tokens_per_s"],
        "ttft_p50": summary["ttft_ms"]["p50"],
        "ttft_p99": summary["ttft_ms"]["p99"],
        "itl_p50": summary["itl_ms"]["p50"],
        "itl_p99": summary["itl_ms"]["p99"],
        "unfinished": summary["unfinished"],
    }


def scaled(costs: RoundCosts, k: float) -> RoundCosts:
    return replace(
        costs,
        kv_transfer_base_ms=costs.kv_transfer_base_ms * k,
        kv_transfer_per_token_ms=costs.kv_transfer_per_token_ms * k,
    )


def run_cell(preset: str, workload: str, load: str, prefill: int, n: int, router: str) -> list:
    inp, out, dist, light, heavy = WORKLOADS[workload]
    rate = light if load == "light" else heavy
    spec = WorkloadSpec(
        num_requests=n, rate=rate, input_len=inp, output_len=out, length_dist=dist, seed=0
    )
    arrivals = tuple(generate(spec))
    costs = PRESETS[preset]
    rows = []
    for policy in ("none", "roundgate"):
        run = SimSpec(
            fused_args(prefill + DECODE_RANKS, policy), arrivals, costs, RouterSpec(router)
        )
        rows.append(row(f"fused {policy} dp={prefill + DECODE_RANKS}", summarize(simulate(run))))
    base = SimSpec(fused_args(prefill + DECODE_RANKS, "none"), arrivals, costs, RouterSpec(router))
    for k in MULTIPLIERS:
        result, sim = simulate_pd(replace(base, costs=scaled(costs, k)), prefill, DECODE_RANKS)
        gbps = KV_BYTES[preset] / (costs.kv_transfer_per_token_ms * k * 1e6) if k else None
        link = "free" if gbps is None else f"{gbps:.3g} GB/s"
        entry = row(f"P/D {prefill}:{DECODE_RANKS} x{k} ({link})", summarize(result))
        entry["transfers"] = describe_transfers(sim)
        rows.append(entry)
    return rows


def markdown(title: str, rows: list[dict]) -> str:
    head = "| arm | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |"
    lines = [f"**{title}**", "", head, "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        cells = [r[k] for k in ("out_tok_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99")]
        text = " | ".join(f"{c:,.1f}" if c is not None else "-" for c in cells)
        flag = f" ({r['unfinished']} unfinished)" if r["unfinished"] else ""
        lines.append(f"| {r['arm']}{flag} | {text} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="h100-dsv3,gb200-dsv3")
    p.add_argument("--workloads", default="chat,agentic")
    p.add_argument("--loads", default="light,heavy")
    p.add_argument("--prefill-ranks", default="2,4")
    p.add_argument("--router", default="round-robin")
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--json", type=Path, default=None)
    ns = p.parse_args()
    report = []
    for preset in ns.presets.split(","):
        for workload in ns.workloads.split(","):
            for load in ns.loads.split(","):
                for prefill in (int(x) for x in ns.prefill_ranks.split(",")):
                    rows = run_cell(preset, workload, load, prefill, ns.num_requests, ns.router)
                    title = f"{preset}, {workload} {load}, {ns.router}, P={prefill}"
                    print(markdown(title, rows), "\n", flush=True)
                    cell = {"preset": preset, "workload": workload, "load": load}
                    report.append(cell | {"prefill_ranks": prefill, "rows": rows})
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
