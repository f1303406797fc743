"""Predict a live ``roundgate bench`` run with the simulator priced from that deployment.

``roundgate bench --compare ... --metrics-dir DIR`` leaves the workload it sent, the exact
deployment config of every policy, what the client measured, and a scrape of the engine before
and after each policy's load. ``predict`` fits one ``--costs`` file over those scrapes
(``roundgate calibrate``), replays each run's workload with ``roundgate simulate`` (the same
seed, so the same arrivals and lengths; the same dp size, router, limits and policy flags) and
pairs the simulated figures with the measured ones. ``benchmarks/close_the_loop.py`` prints it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from cli.main import build_parser, main

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


def predict(
    benches: list[Path], metrics_dirs: list[Path], fit_from: set[str] | None, costs_out: Path
) -> tuple[dict, list[dict]]:
    """The fitted costs and one row per (run, policy, figure): live, simulated, error."""
    if len(benches) != len(metrics_dirs):
        raise ValueError("give one metrics dir per bench report")
    reports = [json.loads(path.read_text()) for path in benches]
    runs = [
        (directory, policy)
        for directory, report in zip(metrics_dirs, reports, strict=True)
        for policy in report["results"]
        if fit_from is None or policy in fit_from
    ]
    costs = calibrate(runs, costs_out)
    known = simulate_flags()
    missing = sorted(set(GROUP_FLAGS + WORKLOAD_FLAGS) - known)
    if missing:
        raise ValueError(f"roundgate simulate has no flag for {missing}")
    table = []
    for path, report in zip(benches, reports, strict=True):
        for policy, live in report["results"].items():
            sim = simulate(costs_out, report["workload"], report["configs"][policy], policy, known)
            for row in compare(live, sim):
                table.append({"bench": path.name, "policy": policy, **row})
    return costs, table
