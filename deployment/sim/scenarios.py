"""Published measurements the simulator must reproduce, each with the setup that produced it.

A scenario names its source, the deployment (group size, router, workload), the arms it
compares (a policy and its flags each) and the published figures of every arm. ``replay``
runs each arm on the scenario's cost preset and returns published against simulated, with the
relative error of each figure; ``roundgate simulate --scenario NAME`` prints that table and a
test holds the errors inside the scenario's tolerances.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actors.server_args import ServerArgs
from deployment.sim.report import summarize
from deployment.sim.round_costs import PRESETS, RoundCosts
from deployment.sim.simulator import GroupSimulator
from deployment.sim.workload import Router, WorkloadSpec, generate

# Figure name -> (summary key, statistic); requests/s is a top-level key.
FIGURES: dict[str, tuple[str, str | None]] = {
    "throughput_rps": ("requests_per_s", None),
    "itl_p50_ms": ("itl_ms", "p50"),
    "itl_mean_ms": ("itl_ms", "mean"),
    "tpot_mean_ms": ("tpot_ms", "mean"),
    "ttft_mean_ms": ("ttft_ms", "mean"),
    "ttft_p99_ms": ("ttft_ms", "p99"),
}
FIGURE_LABELS = {
    "throughput_rps": "throughput (req/s)",
    "itl_p50_ms": "P50 ITL (ms)",
    "itl_mean_ms": "mean ITL (ms)",
    "tpot_mean_ms": "mean TPOT (ms)",
    "ttft_mean_ms": "mean TTFT (ms)",
    "ttft_p99_ms": "P99 TTFT (ms)",
}


@dataclass(frozen=True)
class Arm:
    """One measured configuration: a label, the policy and its flags, published figures."""

    label: str
    policy: str
    flags: Mapping[str, Any]
    published: Mapping[str, float]


@dataclass(frozen=True)
class Scenario:
    source: str
    costs: str  # the preset the scenario runs on
    dp_size: int
    router: str
    workload: WorkloadSpec
    arms: tuple[Arm, ...]
    route_weights: tuple[int, ...] | None = None
    engine: Mapping[str, Any] = field(default_factory=dict)  # other ServerArgs
    tolerance: float = 0.20
    tolerances: Mapping[str, float] = field(default_factory=dict)  # per figure, else above

    def tolerance_of(self, figure: str) -> float:
        return self.tolerances.get(figure, self.tolerance)


SCENARIOS: dict[str, Scenario] = {
    # vLLM PR #44558, workload A: DeepSeek-R1-0528 FP4, DP8/EP on 2x GB200, internal LB,
    # cudagraph, random 1k/200 with --ignore-eos, Poisson 24 req/s. Interval 1 is the
    # baseline (the feature off, i.e. no policy); interval 2 with the capacity-bound guard.
    "vllm-44558": Scenario(
        source="vLLM PR #44558, workload A (CALIBRATION.md)",
        costs="gb200-dsv3",
        dp_size=8,
        # vLLM's internal load balancer: least 4 x waiting + running, on counts refreshed
        # from the DP coordinator every 100 ms.
        router="vllm-lb",
        workload=WorkloadSpec(
            num_requests=4800, arrival="poisson", rate=24.0, input_len=1000, output_len=200
        ),
        engine={
            # vLLM's defaults on a >= 70 GB GPU: 8,192 batched tokens, 1,024 sequences per
            # engine; KV for far more than the ~150 running a rank holds here.
            "max_scheduled_tokens": 8192,
            "max_num_seqs": 1024 * 8,
            "page_size": 64,
            "num_kv_pages": 8192,
            "enable_mixed_prefill_decode": True,
        },
        arms=(
            Arm(
                "interval 1",
                "none",
                {},
                {
                    "throughput_rps": 22.43,
                    "itl_p50_ms": 274.9,
                    "itl_mean_ms": 236.7,
                    "tpot_mean_ms": 240.5,
                    "ttft_mean_ms": 813.0,
                    "ttft_p99_ms": 2476.0,
                },
            ),
            Arm(
                "interval 2",
                "vllm-interval",
                {"prefill_schedule_interval": 2},
                {
                    "throughput_rps": 22.59,
                    "itl_p50_ms": 32.1,
                    "itl_mean_ms": 139.4,
                    "tpot_mean_ms": 140.2,
                    "ttft_mean_ms": 502.0,
                    "ttft_p99_ms": 1475.0,
                },
            ),
        ),
        tolerances={"ttft_p99_ms": 0.35},
    ),
}


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
    """The summary of one arm on the scenario's preset (or ``costs``)."""
    args = ServerArgs(
        dp_size=scenario.dp_size, prefill_policy=arm.policy, **scenario.engine, **arm.flags
    )
    spec = scenario.workload
    changes = {"seed": seed} | ({"num_requests": num_requests} if num_requests else {})
    spec = WorkloadSpec(**(vars_of(spec) | changes))
    sim = GroupSimulator(
        args,
        costs or PRESETS[scenario.costs],
        Router(scenario.router, scenario.dp_size, scenario.route_weights, seed=seed),
        arm.policy,
        keep_timeline=False,
    )
    return summarize(sim.run(generate(spec)))


def vars_of(spec: WorkloadSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}


@dataclass(frozen=True)
class FigureRow:
    arm: str
    figure: str
    published: float
    simulated: float | None
    tolerance: float

    @property
    def error(self) -> float | None:
        """Relative error of the simulated figure, (sim - published) / published."""
        if self.simulated is None:
            return None
        return (self.simulated - self.published) / self.published

    @property
    def within(self) -> bool:
        return self.error is not None and abs(self.error) <= self.tolerance


def replay(
    name: str, costs: RoundCosts | None = None, num_requests: int | None = None, seed: int = 0
) -> tuple[list[FigureRow], dict[str, dict[str, Any]]]:
    """Every arm of scenario ``name``: the figure rows and each arm's full summary."""
    if name not in SCENARIOS:
        raise ValueError(f"--scenario must be one of {', '.join(SCENARIOS)}, got {name!r}")
    scenario = SCENARIOS[name]
    rows: list[FigureRow] = []
    summaries: dict[str, dict[str, Any]] = {}
    for arm in scenario.arms:
        summary = run_arm(scenario, arm, costs, num_requests, seed)
        summaries[arm.label] = summary
        for figure, published in arm.published.items():
            rows.append(
                FigureRow(
                    arm.label,
                    figure,
                    published,
                    figure_of(summary, figure),
                    scenario.tolerance_of(figure),
                )
            )
    return rows, summaries


def format_rows(rows: list[FigureRow]) -> str:
    """published vs simulated, the error and whether it is inside the tolerance."""
    lines = [("arm", "figure", "published", "simulated", "error", "tolerance", "")]
    for row in rows:
        sim = "-" if row.simulated is None else f"{row.simulated:.1f}"
        err = "-" if row.error is None else f"{row.error * 100:+.1f} %"
        lines.append(
            (
                row.arm,
                FIGURE_LABELS[row.figure],
                f"{row.published:g}",
                sim,
                err,
                f"±{row.tolerance * 100:.0f} %",
                "ok" if row.within else "MISS",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )
