"""The executor interface: what runs a RoundPlan (the model runner, or the cost model)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from roundgate.actors.control.round import RoundPlan, RoundResult
from roundgate.gate.rows import RankRow, RoundView


class Executor(Protocol):
    """Runs one rank's plan for one round.

    ``rows`` are this round's gathered rows (every rank's plan summary) and ``view`` their one
    reading (``view.low_latency``: nobody extends, so DeepEP's low-latency legs may run). A
    rank whose plan is empty is still called while any rank has work, so it can join the MoE
    collectives with an idle forward; ``RankLoop`` does not call it when every rank is idle.

    Under ``--async-scheduling`` it is called on one worker thread, one round at a time and in
    round order, with a copy of the plan whose requests the rank's thread no longer changes
    (``async_rounds.py``): it must not keep state on a request between rounds.
    """

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow], view: RoundView) -> RoundResult: ...


class RoundAborted(RuntimeError):
    """The group re-formed in the middle of a round's forward (a member died after the
    gather: an elastic MoE group's expert collectives failed). The round's vote and plan
    stand; ``RankLoop.step`` gathers its row again in the new group and runs the forward again
    (the executor ran its one-off steps once, and sampled nothing)."""
