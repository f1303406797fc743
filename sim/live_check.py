"""Predict a live ``roundgate bench`` run with the simulator priced from that deployment.

``roundgate bench --compare ... --metrics-dir DIR`` leaves the workload it sent, the exact
deployment config of every policy, what the client measured, and a scrape of the engine before
and after each policy's load. ``predict`` fits one ``--costs`` file over those scrapes
(``roundgate calibrate``), replays each run's workload in the simulator as ``roundgate
simulate`` would with those flags (the same seed, so the same arrivals and lengths; the same dp
size, router, limits and policy flags; simulate's defaults for what the report leaves unset) and
pairs the simulated figures with the measured ones. ``benchmarks/close_the_loop.py`` prints it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from roundgate.gate import registry
from roundgate.routing import registry as routers
from roundgate.sim.calibration import calibrate
from roundgate.sim.options import (
    BASE_LENGTHS,
    GROUP_DEFAULTS,
    WORKLOAD_DEFAULTS,
    policy_args,
    router_spec,
)
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import RoundCosts, load_costs
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.workload import WorkloadSpec

FIGURES = (("ttft_ms", "p50"), ("itl_ms", "p50"), ("ttft_ms", "p99"), ("itl_ms", "p99"))
TOLERANCE = 0.25  # the bound on TTFT p50 and ITL p50


def _given(values: Mapping[str, Any], name: str, default: Any) -> Any:
    """A recorded flag's value; ``default`` where it is missing or unset (None)."""
    value = values.get(name)
    return default if value is None else value


def replay_spec(
    costs: RoundCosts, workload: Mapping[str, Any], config: Mapping[str, Any], policy: str
) -> SimSpec:
    """One live run as a simulation: the bench's workload flags, the deployment's group shape,
    router and ``policy``'s own flags (by flag name; the others are not its to read)."""
    group = {name: _given(config, name, default) for name, default in GROUP_DEFAULTS.items()}
    args = policy_args(
        policy,
        {name: value for name, value in config.items() if name in registry.all_flags()},
        enable_prefix_caching=bool(config.get("enable_prefix_caching", True)),
        **group,
    )
    sent = {name: _given(workload, name, v) for name, v in WORKLOAD_DEFAULTS.items()}
    sent |= {name: _given(workload, name, v) for name, v in BASE_LENGTHS.items()}
    return SimSpec(
        args,
        WorkloadSpec(**sent),
        costs,
        router_spec(_given(config, "router", routers.DEFAULT), args),
        seed=sent["seed"],
        concurrency=workload.get("concurrency"),
    )


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
    benches: list[Path],
    metrics_dirs: list[Path],
    fit_from: set[str] | None,
    costs_out: Path,
    fit_benches: set[str] | None = None,
) -> tuple[dict, list[dict]]:
    """The fitted costs (also written to ``costs_out``) and one row per (run, policy,
    figure): live, simulated, error, and whether the fit saw that run. ``fit_from`` limits
    the fit to those policies' runs, ``fit_benches`` to those bench reports (by file name:
    one load predicting another)."""
    if len(benches) != len(metrics_dirs):
        raise ValueError("give one metrics dir per bench report")
    names = {path.name for path in benches}
    if fit_benches is not None and not fit_benches <= names:
        unknown = ", ".join(sorted(fit_benches - names))
        raise ValueError(f"--fit-bench {unknown}: not among the --bench reports")
    reports = [json.loads(path.read_text()) for path in benches]

    def in_fit(path: Path, policy: str) -> bool:
        return (fit_from is None or policy in fit_from) and (
            fit_benches is None or path.name in fit_benches
        )

    runs = [
        (directory, policy)
        for path, directory, report in zip(benches, metrics_dirs, reports, strict=True)
        for policy in report["results"]
        if in_fit(path, policy)
    ]
    if not runs:
        raise ValueError("--fit-from/--fit-bench leave no run to fit")
    fitted = calibrate(
        dp_size=2,
        base="toy",
        metrics=[directory / f"{policy}.after.prom" for directory, policy in runs],
        baselines=[directory / f"{policy}.before.prom" for directory, policy in runs],
    )
    text = json.dumps(fitted, indent=2, sort_keys=True) + "\n"
    costs_out.parent.mkdir(parents=True, exist_ok=True)
    costs_out.write_text(text)
    costs = json.loads(text)  # as the file reads back (what --costs FILE would run)
    priced = load_costs(str(costs_out), text)
    table = []
    for path, report in zip(benches, reports, strict=True):
        for policy, live in report["results"].items():
            spec = replay_spec(priced, report["workload"], report["configs"][policy], policy)
            sim = summarize(simulate(spec))
            seen = in_fit(path, policy)
            superseded = report.get("superseded", {}).get(policy)
            for row in compare(live, sim):
                if superseded:
                    # The run is of a policy this build has replaced under the same name
                    # (the report says which and why): today's is replayed and shown, but
                    # not held to the old run's figures.
                    row = {**row, "checked": False, "superseded": superseded}
                table.append({"bench": path.name, "policy": policy, "fitted": seen, **row})
    return costs, table
