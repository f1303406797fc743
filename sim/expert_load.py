"""How popular each routed expert of a MoE layer is, round by round: the simulator's skew.

A MoE router does not spread tokens evenly: some experts are hot, and which ones changes with
the traffic. Pricing a MoE round as if every rank carried the mean load hides the cost that
expert-parallel load balancing (EPLB) exists to remove, so the simulator needs a popularity
that is skewed, moves slowly, and is the same for the same seed (runs compare policies and
placements on identical traffic).

The model, per MoE layer: each expert has a log-popularity ``x_e``, drawn at round 0 from a
normal distribution with standard deviation ``skew`` (log-normal shares: a few hot experts,
a long cool tail, as measured expert loads look). Every busy round each ``x_e`` takes a
random-walk step of standard deviation ``drift``, pulled back towards 0 just enough that the
spread stays ``skew`` (``x' = keep * x + drift * z`` with ``keep = sqrt(1 - (drift/skew)^2)``):
the hot set wanders, the degree of skew does not grow without bound over a long run. An
expert's share of the layer's routed tokens is ``exp(x_e) / sum(exp(x))``.

Pure Python (``random.Random``), like the rest of the simulator's hot path: no numpy import
for a run, and the draws are reproducible across platforms.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class PopularitySpec:
    """The popularity of ``num_experts`` routed experts in each of ``num_layers`` MoE layers."""

    num_experts: int
    num_layers: int
    skew: float  # standard deviation of log-popularity across experts (0: uniform)
    drift: float  # standard deviation of one round's random-walk step in log-popularity
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_experts < 1 or self.num_layers < 1:
            raise ValueError("a popularity needs at least one expert and one layer")
        if not self.skew >= 0:
            raise ValueError(f"--expert-skew must be >= 0, got {self.skew}")
        if not 0 <= self.drift <= self.skew:
            # A step wider than the spread it keeps has no mean-reverting walk to describe.
            raise ValueError(
                f"--expert-drift must be >= 0 and <= --expert-skew ({self.skew}), got {self.drift}"
            )


class ExpertPopularity:
    """The seeded, slowly drifting popularity of every expert in every simulated layer.

    ``shares()`` is the current round's split of each layer's routed tokens over its experts;
    ``advance()`` moves to the next round. Two instances of one spec give the same sequence.
    """

    def __init__(self, spec: PopularitySpec) -> None:
        self.spec = spec
        self._rng = random.Random(spec.seed)
        gauss = self._rng.gauss
        self._logs = [
            [gauss(0.0, spec.skew) if spec.skew else 0.0 for _ in range(spec.num_experts)]
            for _ in range(spec.num_layers)
        ]
        self._keep = math.sqrt(1.0 - (spec.drift / spec.skew) ** 2) if spec.skew else 1.0
        self._shares: list[list[float]] | None = None
        self.round = 0

    def shares(self) -> list[list[float]]:
        """Per layer, each expert's share of the layer's routed tokens (each layer sums to 1)."""
        if self._shares is None:
            self._shares = [_normalized_exp(logs) for logs in self._logs]
        return self._shares

    def advance(self) -> None:
        """One round's drift (nothing moves without drift, and the shares stay cached)."""
        self.round += 1
        drift = self.spec.drift
        if not drift:
            return
        keep, gauss = self._keep, self._rng.gauss
        self._logs = [[keep * x + gauss(0.0, drift) for x in logs] for logs in self._logs]
        self._shares = None


def _normalized_exp(logs: list[float]) -> list[float]:
    """``softmax(logs)``, shifted by the maximum so no ``exp`` overflows."""
    top = max(logs)
    weights = [math.exp(x - top) for x in logs]
    total = sum(weights)
    return [w / total for w in weights]


def hottest_over_mean(shares: list[float]) -> float:
    """The hottest expert's share over the mean share: how skewed one layer is (1: uniform)."""
    return max(shares) * len(shares)
