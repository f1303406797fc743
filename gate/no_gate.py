"""No policy at all: prefill whenever a rank has it (what a fused engine runs without a gate)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.spec import PolicyContext, PolicySpec
from roundgate.gate.vote import OPEN, GateVote


@dataclass(frozen=True)
class NoGateConfig:
    """No flags."""


class NoGate:
    """Admit prefill whenever a rank has it."""

    extra_columns: tuple[str, ...] = ()
    steady = True  # no state at all
    rounds_since_prefill: int | None = None  # it keeps no count

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        return OPEN

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        return None

    def quiet_rounds_until_open(self, rows: Sequence[RankRow]) -> int:
        return 0  # always open

    def advance_quiet(self, k: int) -> None:
        return None


def _build(config: NoGateConfig, ctx: PolicyContext) -> NoGate:
    return NoGate()


POLICY = PolicySpec(
    name="none",
    summary="nothing: prefill whenever a rank has it",
    config=NoGateConfig,
    build=_build,
)
