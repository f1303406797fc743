"""The executor interface: what runs a RoundPlan (the model runner, or the cost model)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from actors.control.round import RoundPlan, RoundResult
from gate import RankRow


def is_low_latency(rows: Sequence[RankRow]) -> bool:
    """DeepEP low-latency legs are usable iff no rank of the group extends this round."""
    return all(row.num_extends == 0 for row in rows)


class Executor(Protocol):
    """Runs one rank's plan for one round.

    ``rows`` are this round's gathered rows (every rank's plan summary). A rank whose plan is
    empty is still called while any rank has work, so it can join the MoE collectives with an
    idle forward; ``dp_round`` does not call it at all when every row is idle.
    """

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow]) -> RoundResult: ...
