"""Issue 37's matrix: every policy x workload x dp {8, 128} x load, seeds, goodput first.

    .venv/bin/python benchmarks/goodput_matrix.py --out out/matrix.jsonl [--workers 2]
        [--seeds 0,1,2] [--dp 8,128] [--workloads chat,bursty] [--loads below,near,past]
        [--spec off,k2a0.7]
    .venv/bin/python benchmarks/goodput_matrix.py --out out/matrix.jsonl --report

Each cell (``goodput_matrix_cells``) runs every registered policy at its simulate defaults and
the fixed gate over the tune grid on the same seeded arrivals. Runs are appended to ``--out``
as JSON lines as they finish, and a rerun skips what is there, so a long matrix can stop and
resume. ``--report`` prints, per cell, the means over seeds and the adaptive gate's targets:
goodput within 5 % of the best fixed-interval gate's (the tune grid's best pair in that cell),
never below ``none``'s, at least 1.2x the best peer's wherever some gate beats ``none`` by
20 %; and at dp=128 chat, TTFT p50 <= 1.5x ``none``'s with ITL p50 <= 0.9x ``none``'s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from common import finished_runs
from goodput_matrix_cells import LOADS, WORKLOAD_NAMES, Arm, Cell, arms, run_arm

from roundgate.sim.tune import candidates

AUTO = "roundgate-auto"
FIXED = "roundgate "  # label prefix of the tune grid's arms
GRID = candidates("1,2,4,8", "4,16,64")


def _job(job: tuple[Cell, Arm, int]) -> dict[str, Any]:
    return run_arm(*job)


def run(ns: argparse.Namespace) -> None:
    done = finished_runs(ns.out)
    cells = [
        Cell(w, dp, load, "" if spec == "off" else spec)
        for dp in ns.dp
        for w in ns.workloads
        for load in ns.loads
        for spec in ns.spec
    ]
    jobs = [
        (cell, arm, seed)
        for cell in cells
        for seed in ns.seeds
        for arm in arms(GRID)
        if (cell.key, arm.label, seed) not in done
        and (ns.policies is None or arm.label.startswith(FIXED) or arm.label in ns.policies)
    ]
    print(f"{len(jobs)} runs to do ({len(done)} already in {ns.out})", file=sys.stderr)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    with ns.out.open("a") as out, ProcessPoolExecutor(ns.workers) as pool:
        for i, record in enumerate(pool.map(_job, jobs, chunksize=1), 1):
            out.write(json.dumps(record) + "\n")
            out.flush()
            if i % 20 == 0:
                print(f"{i}/{len(jobs)} {record['cell']}", file=sys.stderr)


def _means(records: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """cell -> arm -> metric -> mean over seeds."""
    grouped: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        grouped.setdefault((r["cell"], r["arm"]), []).append(r)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (cell, arm), rs in grouped.items():
        metrics = ("goodput", "good_fraction", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
        out.setdefault(cell, {})[arm] = {
            m: statistics.fmean(r[m] for r in rs if r[m] is not None) for m in metrics
        } | {"seeds": len(rs)}
    return out


def targets(cell: str, res: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The adaptive gate's targets in one cell (see the module docstring)."""
    auto, none = res[AUTO]["goodput"], res["none"]["goodput"]
    fixed = {a: r for a, r in res.items() if a.startswith(FIXED)}
    best_fixed = max(fixed, key=lambda a: fixed[a]["goodput"])
    peers = {
        a: r for a, r in res.items() if a not in (AUTO, "none", "roundgate") and a not in fixed
    }
    best_peer = max(peers, key=lambda a: peers[a]["goodput"])
    gates = [r["goodput"] for a, r in res.items() if a != "none"]
    out = {
        "best_fixed": best_fixed,
        "vs_best_fixed": auto / fixed[best_fixed]["goodput"]
        if fixed[best_fixed]["goodput"]
        else None,
        "vs_none": auto / none if none else None,
        "best_peer": best_peer,
        "vs_best_peer": auto / peers[best_peer]["goodput"] if peers[best_peer]["goodput"] else None,
        "gate_wins_20pct": max(gates) >= 1.2 * none,
    }
    out["ok_fixed"] = out["vs_best_fixed"] is None or out["vs_best_fixed"] >= 0.95
    out["ok_none"] = auto >= none
    out["ok_peer"] = not out["gate_wins_20pct"] or (out["vs_best_peer"] or 0) >= 1.2
    if cell.startswith("chat/dp128"):
        n, a = res["none"], res[AUTO]
        out["ttft_p50_vs_none"] = a["ttft_p50"] / n["ttft_p50"]
        out["itl_p50_vs_none"] = a["itl_p50"] / n["itl_p50"]
        out["ok_dp128"] = out["ttft_p50_vs_none"] <= 1.5 and out["itl_p50_vs_none"] <= 0.9
    return out


def report(ns: argparse.Namespace) -> None:
    records = [json.loads(line) for line in ns.out.read_text().splitlines()]
    means = _means(records)
    print(
        "| cell | auto goodput | best fixed (pair) | none | best peer (who) | auto/fixed | "
        "auto/none | auto/peer | auto TTFT p50/p99 | auto ITL p50/p99 | misses |"
    )
    print("|" + " --- |" * 11)
    for cell in sorted(means, key=_order):
        res = means[cell]
        if AUTO not in res or "none" not in res:
            continue
        t = targets(cell, res)
        a = res[AUTO]
        misses = [k for k in ("ok_fixed", "ok_none", "ok_peer", "ok_dp128") if t.get(k) is False]
        extra = ""
        if "ttft_p50_vs_none" in t:
            ttft, itl = t["ttft_p50_vs_none"], t["itl_p50_vs_none"]
            extra = f" (TTFT p50 {ttft:.2f}x, ITL p50 {itl:.2f}x none)"
        print(
            f"| {cell} | {a['goodput']:.3f} | {res[t['best_fixed']]['goodput']:.3f} "
            f"({t['best_fixed'][len(FIXED) :]}) | {res['none']['goodput']:.3f} | "
            f"{res[t['best_peer']]['goodput']:.3f} ({t['best_peer']}) | "
            f"{_x(t['vs_best_fixed'])} | {_x(t['vs_none'])} | {_x(t['vs_best_peer'])} | "
            f"{a['ttft_p50']:.0f}/{a['ttft_p99']:.0f} | {a['itl_p50']:.1f}/{a['itl_p99']:.1f} | "
            f"{', '.join(misses) or '-'}{extra} |"
        )
    if ns.detail:
        for cell in sorted(means, key=_order):
            print(f"\n{cell}")
            for arm, r in sorted(means[cell].items(), key=lambda kv: -kv[1]["goodput"]):
                print(
                    f"  {arm:24s} goodput {r['goodput']:8.3f} good {r['good_fraction']:.3f} "
                    f"TTFT {r['ttft_p50']:8.0f}/{r['ttft_p99']:8.0f} "
                    f"ITL {r['itl_p50']:6.1f}/{r['itl_p99']:7.1f} seeds {r['seeds']}"
                )


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _order(cell: str) -> tuple:
    workload, dp, load, *spec = cell.split("/")
    return (int(dp[2:]), WORKLOAD_NAMES.index(workload), list(LOADS).index(load), spec)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON lines, appended and resumed")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1, 2])
    p.add_argument("--dp", type=lambda s: [int(v) for v in s.split(",")], default=[8, 128])
    p.add_argument("--workloads", type=lambda s: s.split(","), default=list(WORKLOAD_NAMES))
    p.add_argument("--loads", type=lambda s: s.split(","), default=list(LOADS))
    p.add_argument(
        "--spec",
        type=lambda s: s.split(","),
        default=["off"],
        help="speculative decoding per cell: off, or kKaA (K drafts, acceptance A), e.g. "
        "off,k2a0.7",
    )
    p.add_argument(
        "--policies",
        type=lambda s: s.split(","),
        default=None,
        help="registered policies to run (default: all); the tune grid always runs",
    )
    p.add_argument("--report", action="store_true", help="print the tables from --out")
    p.add_argument("--detail", action="store_true", help="with --report: every arm per cell")
    ns = p.parse_args(argv)
    for w in ns.workloads:
        if w not in WORKLOAD_NAMES:
            p.error(f"--workloads: unknown {w!r} (known: {', '.join(WORKLOAD_NAMES)})")
    for load in ns.loads:
        if load not in LOADS:
            p.error(f"--loads: unknown {load!r} (known: {', '.join(LOADS)})")
    for dp in ns.dp:
        if dp < 8 or dp % 8:
            p.error(f"--dp: {dp} is not a multiple of 8")
    report(ns) if ns.report else run(ns)


if __name__ == "__main__":
    main()
