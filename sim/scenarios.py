"""Replaying published measurements: each arm on the scenario's cost preset, published
against simulated, with the relative error of each figure. ``roundgate simulate --scenario
NAME`` prints that table; tests hold the errors inside the scenario's tolerances.

A published figure covers its whole run, warm-up and drain included, so each arm is compared
over its whole run at the run length the scenario assumes (``Scenario.run_length``), and
beside it over the warm-up-trimmed steady-state window (``roundgate.sim.steady``), which also says
whether the simulated arm keeps up with the offered load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roundgate.actors.server_args import ServerArgs
from roundgate.sim.published import SCENARIOS
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS, RoundCosts
from roundgate.sim.router import RouterSpec
from roundgate.sim.scenario_spec import FIGURE_LABELS, FIGURES, Arm, Scenario
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.steady import steady_report
from roundgate.sim.workload import WorkloadSpec

__all__ = ["SCENARIOS", "FigureRow", "format_rows", "replay", "run_arm"]


def figure_of(summary: Mapping[str, Any], figure: str) -> float | None:
    key, stat = FIGURES[figure]
    value = summary[key] if stat is None else summary[key][stat]
    return None if value is None else float(value)


def run_arm(
    scenario: Scenario,
    arm: Arm,
    costs: RoundCosts | None = None,
    num_requests: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The summary of one arm on the scenario's preset (or ``costs``), with its steady state
    (``steady_state``: the window, its figures and the run's series)."""
    # The replayed benchmarks send random prompts (no prefix shared): the prefix cache could
    # only add bookkeeping, so it is off here, as when the presets were fitted.
    engine = {"enable_prefix_caching": False, **scenario.engine}
    args = ServerArgs(dp_size=scenario.dp_size, prefill_policy=arm.policy, **engine, **arm.flags)
    changes = {"seed": seed} | ({"num_requests": num_requests} if num_requests else {})
    spec = SimSpec(
        args,
        WorkloadSpec(**(vars_of(scenario.workload) | changes)),
        costs or PRESETS[scenario.costs],
        RouterSpec(scenario.router, scenario.route_weights),
        seed=seed,
        concurrency=scenario.concurrency,
    )
    result = simulate(spec)
    return summarize(result) | {"steady_state": steady_report(result)}


def vars_of(spec: WorkloadSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}


@dataclass(frozen=True)
class FigureRow:
    arm: str
    figure: str
    published: float
    simulated: float | None
    tolerance: float
    # This figure of this arm over the first arm's, published and simulated (None: first arm).
    published_change: float | None = None
    simulated_change: float | None = None
    direction_only: bool = False
    steady: float | None = None  # the figure over the steady-state window

    @property
    def same_direction(self) -> bool | None:
        """Whether the arm moves the figure the way the publication did (None: first arm)."""
        if self.published_change is None or self.simulated_change is None:
            return None
        # A change under 2 % is no change: it cannot match a published one.
        moved = abs(self.simulated_change - 1) >= 0.02
        return moved and (self.published_change - 1) * (self.simulated_change - 1) > 0

    @property
    def error(self) -> float | None:
        """Relative error of the simulated figure, (sim - published) / published."""
        if self.simulated is None:
            return None
        return (self.simulated - self.published) / self.published

    @property
    def within(self) -> bool:
        """Inside the tolerance; for a direction-only replay, the direction of the change."""
        if self.direction_only:
            return self.same_direction is not False
        return self.error is not None and abs(self.error) <= self.tolerance

    @property
    def verdict(self) -> str:
        """What the row shows: ``ok``/``MISS`` against the tolerance; a direction-only row
        says so and how far off the magnitude is, so it never reads as a plain "ok"."""
        if not self.direction_only:
            return "ok" if self.within else "MISS"
        off = "-" if self.error is None else f"{self.error * 100:+.0f} %"
        if self.same_direction is False:
            return f"MISS: direction wrong (direction only, magnitude off by {off})"
        return f"direction only, magnitude off by {off}"


def replay(
    name: str, costs: RoundCosts | None = None, num_requests: int | None = None, seed: int = 0
) -> tuple[list[FigureRow], dict[str, dict[str, Any]]]:
    """Every arm of scenario ``name``: the figure rows and each arm's full summary."""
    if name not in SCENARIOS:
        raise ValueError(f"--scenario must be one of {', '.join(SCENARIOS)}, got {name!r}")
    scenario = SCENARIOS[name]
    rows: list[FigureRow] = []
    summaries: dict[str, dict[str, Any]] = {}
    first: dict[str, tuple[float, float | None]] = {}
    for arm in scenario.arms:
        summary = run_arm(scenario, arm, costs, num_requests, seed)
        summaries[arm.label] = summary
        window = summary["steady_state"]["figures"]
        for figure, published in arm.published.items():
            simulated = figure_of(summary, figure)
            steady = figure_of(window, figure) if window is not None else None
            base = first.setdefault(figure, (published, simulated))
            changes = (None, None)
            if arm is not scenario.arms[0] and base[1]:
                changes = (published / base[0], None if simulated is None else simulated / base[1])
            rows.append(
                FigureRow(
                    arm.label,
                    figure,
                    published,
                    simulated,
                    scenario.tolerance_of(figure),
                    *changes,
                    direction_only=scenario.direction_only,
                    steady=steady,
                )
            )
    return rows, summaries


def format_rows(rows: list[FigureRow]) -> str:
    """published vs simulated, the error and whether it is inside the tolerance."""
    lines = [
        (
            "arm",
            "figure",
            "published",
            "simulated",
            "error",
            "steady window",
            "change pub/sim",
            "tolerance",
            "",
        )
    ]
    for row in rows:
        sim = "-" if row.simulated is None else f"{row.simulated:.1f}"
        err = "-" if row.error is None else f"{row.error * 100:+.1f} %"
        change = "-"
        if row.published_change is not None and row.simulated_change is not None:
            change = f"{row.published_change:.2f}x / {row.simulated_change:.2f}x"
        tolerance = "direction" if row.direction_only else f"±{row.tolerance * 100:.0f} %"
        steady = "-" if row.steady is None else f"{row.steady:.1f}"
        lines.append(
            (
                row.arm,
                FIGURE_LABELS[row.figure],
                f"{row.published:g}",
                sim,
                err,
                steady,
                change,
                tolerance,
                row.verdict,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )
