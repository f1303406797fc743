"""Does the simulator, priced from a live deployment, predict that deployment's own bench?

    .venv/bin/python benchmarks/close_the_loop.py --bench A.json [--bench B.json ...] \
        --metrics-dir DIR_A [--metrics-dir DIR_B ...] [--fit-from POLICY,...] \
        [--costs-out docs/results/costs_cpu_local.json] [--json docs/results/close_the_loop.json]

Each ``--bench`` is a ``roundgate bench --compare ... --metrics-dir DIR`` report: the workload it
sent, the exact deployment config of every policy, and what the client measured. The script

1. runs ``roundgate calibrate`` over the scrapes of the runs (``POLICY.after.prom`` minus
   ``POLICY.before.prom`` in each metrics dir; ``--fit-from`` limits which policies' runs are
   fitted, so a prediction can be checked on runs the fit never saw);
2. runs ``roundgate simulate`` with those costs on each run's workload (same seed, so the same
   arrivals and lengths), dp size, router, limits and policy flags;
3. prints live vs simulated TTFT p50 and ITL p50 (and the other figures) with the error of each.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from deployment.cli import build_parser, main

# Deployment args that are also simulate flags (the group's shape and limits); policy flags are
# added from the gate registry.
GROUP_FLAGS = (
    "dp_size",
    "max_num_seqs",
    "max_scheduled_tokens",
    "page_size",
    "num_kv_pages",
    "router",
)
WORKLOAD_FLAGS = (
    "num_requests",
    "arrival",
    "rate",
    "concurrency",
    "burst_size",
    "input_len",
    "output_len",
    "length_dist",
    "seed",
)
FIGURES = (("ttft_ms", "p50"), ("itl_ms", "p50"), ("ttft_ms", "p99"), ("itl_ms", "p99"))
TOLERANCE = 0.25  # the bound on TTFT p50 and ITL p50


def simulate_flags() -> set[str]:
    """The ``dest`` of every ``roundgate simulate`` option."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest for a in sub.choices["simulate"]._actions}


def flag_args(values: dict[str, Any], names: set[str]) -> list[str]:
    """``--name value`` for each set value whose name simulate knows."""
    argv: list[str] = []
    for name, value in sorted(values.items()):
        if name not in names or value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    return argv


def calibrate(runs: list[tuple[Path, str]], out: Path) -> dict:
    argv = ["calibrate", "--dp-size", "2", "--base", "toy", "--out", str(out)]
    for directory, policy in runs:
        argv += ["--metrics", str(directory / f"{policy}.after.prom")]
        argv += ["--metrics-baseline", str(directory / f"{policy}.before.prom")]
    if main(argv) != 0:
        raise SystemExit("calibrate failed")
    return json.loads(out.read_text())


def simulate(costs: Path, workload: dict, config: dict, policy: str, known: set[str]) -> dict:
    group = {k: config.get(k) for k in GROUP_FLAGS}
    policy_flags = {k: v for k, v in config.items() if k.startswith("prefill_")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sim.json"
        argv = ["simulate", "--costs", str(costs), "--policy", policy, "--no-progress"]
        argv += [
            "--enable-prefix-caching"
            if config.get("enable_prefix_caching", True)
            else "--no-enable-prefix-caching"
        ]
        argv += flag_args(group | policy_flags, known)
        argv += flag_args({k: workload.get(k) for k in WORKLOAD_FLAGS}, known)
        argv += ["--json", str(out)]
        if main(argv) != 0:
            raise SystemExit(f"simulate failed: {argv}")
        return json.loads(out.read_text())["results"][0]


def compare(live: dict, sim: dict) -> list[dict]:
    rows = []
    for metric, stat in FIGURES:
        measured, predicted = live[metric].get(stat), sim[metric].get(stat)
        error = (predicted - measured) / measured if measured and predicted is not None else None
        rows.append(
            {
                "figure": f"{metric[:-3].upper()} {stat}",
                "live": measured,
                "simulated": predicted,
                "error": None if error is None else round(error, 4),
                "checked": stat == "p50",
            }
        )
    return rows


def main_(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", type=Path, action="append", required=True)
    p.add_argument("--metrics-dir", type=Path, action="append", required=True)
    p.add_argument(
        "--fit-from", default=None, help="policies whose runs the fit uses (default all)"
    )
    p.add_argument("--costs-out", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    ns = p.parse_args(argv)
    if len(ns.bench) != len(ns.metrics_dir):
        p.error("give one --metrics-dir per --bench")
    reports = [json.loads(path.read_text()) for path in ns.bench]
    fit_from = set(ns.fit_from.split(",")) if ns.fit_from else None
    runs = [
        (directory, policy)
        for directory, report in zip(ns.metrics_dir, reports, strict=True)
        for policy in report["results"]
        if fit_from is None or policy in fit_from
    ]
    costs_path = ns.costs_out or Path(tempfile.mkdtemp()) / "costs.json"
    costs = calibrate(runs, costs_path)
    known = simulate_flags()
    missing = sorted(set(GROUP_FLAGS + WORKLOAD_FLAGS) - known)
    if missing:
        raise SystemExit(f"roundgate simulate has no flag for {missing}: update this script")
    table = []
    for path, report in zip(ns.bench, reports, strict=True):
        for policy, live in report["results"].items():
            sim = simulate(costs_path, report["workload"], report["configs"][policy], policy, known)
            for row in compare(live, sim):
                table.append({"bench": path.name, "policy": policy, **row})
    print(json.dumps({k: v for k, v in costs.items() if k != "_source"}, sort_keys=True))
    print(f"{'run':<34} {'figure':<10} {'live':>9} {'sim':>9} {'error':>8}")
    for r in table:
        error = "-" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        mark = (
            " <-" if r["checked"] and r["error"] is not None and abs(r["error"]) > TOLERANCE else ""
        )
        live = "-" if r["live"] is None else f"{r['live']:.1f}"
        sim = "-" if r["simulated"] is None else f"{r['simulated']:.1f}"
        run = f"{r['bench']} {r['policy']}"
        print(f"{run:<34} {r['figure']:<10} {live:>9} {sim:>9} {error:>8}{mark}")
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"command": sys.argv, "costs": costs, "tolerance": TOLERANCE, "rows": table}
        ns.json.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
