"""What a published measurement is: its setup, its arms and the figures each arm reported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roundgate.sim.workload import WorkloadSpec

# Figure name -> (summary key, statistic); requests/s is a top-level key.
FIGURES: dict[str, tuple[str, str | None]] = {
    "throughput_rps": ("requests_per_s", None),
    "itl_p50_ms": ("itl_ms", "p50"),
    "itl_mean_ms": ("itl_ms", "mean"),
    "tpot_mean_ms": ("tpot_ms", "mean"),
    "ttft_mean_ms": ("ttft_ms", "mean"),
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "ttft_p99_ms": ("ttft_ms", "p99"),
    "output_tps": ("output_tokens_per_s", None),
    "tpot_p50_ms": ("tpot_ms", "p50"),
}
FIGURE_LABELS = {
    "throughput_rps": "throughput (req/s)",
    "itl_p50_ms": "P50 ITL (ms)",
    "itl_mean_ms": "mean ITL (ms)",
    "tpot_mean_ms": "mean TPOT (ms)",
    "ttft_mean_ms": "mean TTFT (ms)",
    "ttft_p50_ms": "P50 TTFT (ms)",
    "ttft_p99_ms": "P99 TTFT (ms)",
    "output_tps": "output (tok/s)",
    "tpot_p50_ms": "P50 TPOT (ms)",
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
    # Whether the published run kept up with its offered load, and why we read it so
    # (throughput against the offered rate, the TTFT it reports).
    published_stability: str
    # The run length the comparison assumes, and why (a published figure covers warm-up and
    # drain, whose weight depends on the length).
    run_length: str
    dp_size: int
    router: str
    workload: WorkloadSpec
    arms: tuple[Arm, ...]
    route_weights: tuple[int, ...] | None = None
    engine: Mapping[str, Any] = field(default_factory=dict)  # other ServerArgs
    concurrency: int | None = None  # closed-loop clients instead of the workload's arrivals
    # Replays whose setup is only partly stated: the direction of each arm's change against
    # the first arm must match; the magnitude is reported, not held to a tolerance.
    direction_only: bool = False
    tolerance: float = 0.20
    tolerances: Mapping[str, float] = field(default_factory=dict)  # per figure, else above

    def tolerance_of(self, figure: str) -> float:
        return self.tolerances.get(figure, self.tolerance)
