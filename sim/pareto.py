"""Each policy's TTFT-ITL Pareto front over its own parameter range (``roundgate tune``).

A prefill policy trades time to first token for inter-token latency, and each has a knob
that moves it along that trade (an interval, a delay budget). One setting's figures say
little; the set of settings no other setting beats on both tails (the Pareto front) says
what the policy can offer at all, and two policies' fronts compare the policies without
picking a setting for either. Each policy sweeps its own main knob over a range that spans
its published uses (``SWEEPS``); the gate sweeps its two intervals (tune's grid).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roundgate.gate import registry

# A policy's swept flag and its values (the others keep simulate's defaults). A policy not
# listed (``none``, or one a plugin adds) is one point at its defaults.
SWEEPS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "roundgate-auto": ("prefill_auto_hold_rounds", (0, 1, 2, 3, 4, 8)),
    "local-interval": ("prefill_decode_interval", (1, 2, 4, 8, 16)),
    "sglang-delayer": ("prefill_delayer_max_delay_passes", (5, 10, 30, 60, 120)),
    # vLLM's PR uses 2; #54627 finds the best interval between 2 and 33 by workload.
    "vllm-interval": ("prefill_schedule_interval", (2, 4, 8, 16, 33)),
    "trtllm-balance": ("attention_dp_batching_wait_iters", (1, 5, 10, 20, 40)),
}
GATE_FLAGS = ("prefill_attempt_interval", "prefill_any_attempt_interval")


@dataclass(frozen=True)
class Point:
    """One setting of one policy and the two tails it achieved (lower is better on both)."""

    policy: str
    setting: tuple[tuple[str, Any], ...]  # (flag name, value) of the swept flags
    ttft_p99_ms: float
    itl_p99_ms: float
    goodput_rps: float = 0.0

    @property
    def label(self) -> str:
        if not self.setting:
            return self.policy
        if self.policy == "roundgate":
            values = dict(self.setting)
            return f"roundgate {values[GATE_FLAGS[0]]}/{values[GATE_FLAGS[1]]}"
        return f"{self.policy} " + " ".join(f"{v:g}" for _, v in self.setting)

    def dominates(self, other: Point) -> bool:
        """At least as good on both tails and better on one."""
        return (
            self.ttft_p99_ms <= other.ttft_p99_ms
            and self.itl_p99_ms <= other.itl_p99_ms
            and (self.ttft_p99_ms < other.ttft_p99_ms or self.itl_p99_ms < other.itl_p99_ms)
        )


def pareto_front(points: Iterable[Point]) -> list[Point]:
    """The points no other point dominates, by TTFT p99 (ties: ITL p99); equal points are
    kept once."""
    pool = list(dict.fromkeys(points))
    front = [p for p in pool if not any(q.dominates(p) for q in pool)]
    seen: set[tuple[float, float]] = set()
    unique = []
    for p in sorted(front, key=lambda p: (p.ttft_p99_ms, p.itl_p99_ms)):
        if (p.ttft_p99_ms, p.itl_p99_ms) not in seen:
            seen.add((p.ttft_p99_ms, p.itl_p99_ms))
            unique.append(p)
    return unique


def policies_of(text: str) -> list[str]:
    """``--pareto``: comma-separated policies, or ``all``."""
    known = registry.names()
    names = list(known) if text == "all" else [s.strip() for s in text.split(",") if s.strip()]
    for name in names:
        if name not in known:
            raise ValueError(f"--pareto: unknown policy {name!r} (policies: {', '.join(known)})")
    return names


def settings(policy: str, gate_pairs: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """The flag values ``policy`` is swept over (its own range; the gate: tune's grid)."""
    if policy == "roundgate":
        return [dict(zip(GATE_FLAGS, pair, strict=True)) for pair in gate_pairs]
    if policy not in SWEEPS:
        return [{}]
    flag, values = SWEEPS[policy]
    return [{flag: value} for value in values]


def format_fronts(fronts: Mapping[str, list[Point]]) -> str:
    """One line per policy: its front, TTFT p99 / ITL p99 in ms per setting."""
    lines = ["Pareto fronts (TTFT p99 ms / ITL p99 ms; no other setting of the policy beats both):"]
    width = max((len(name) for name in fronts), default=0)
    for name, front in fronts.items():
        cells = [f"{p.label} ({p.ttft_p99_ms:,.0f} / {p.itl_p99_ms:,.1f})" for p in front]
        lines.append(f"  {name.ljust(width)}  " + ", ".join(cells))
    return "\n".join(lines)
