"""One rank's round, in the order the design fixes.

    vote    = policy.vote(rows gathered last round)        # identical on every rank
    allow   = vote.open and scheduler.probe().wants_prefill  # fresh local read
    plan    = scheduler.plan(allow)
    probe   = scheduler.publish_probe()                     # once, after the plan
    rows    = all_gather(plan summary + probe)              # the only collective for the gate
    policy.observe(rows)
    forward(plan) unless every rank is idle
    scheduler.update(plan, result)

The round is split at the gather (``begin`` / ``finish``) so an in-process driver can run many
ranks in one thread; ``step`` joins the halves around a real ``Gather``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from actors.executor import Executor
from actors.gather import Gather
from actors.round import RoundPlan, RoundResult
from actors.scheduler import Scheduler, TokenEvent
from gate import GateVote, RankRow
from gate.policy import PrefillPolicy
from gate.rows import IDLE_ROW


@dataclass
class RoundOutcome:
    """What happened on this rank this round (for streaming, stats and the simulator)."""

    vote: GateVote
    allow_prefill: bool
    plan: RoundPlan
    rows: list[RankRow]
    result: RoundResult
    events: list[TokenEvent] = field(default_factory=list)

    @property
    def group_idle(self) -> bool:
        return all(row.is_idle for row in self.rows)


class RankLoop:
    """Drives one rank's scheduler, policy and executor round by round."""

    def __init__(
        self,
        scheduler: Scheduler,
        policy: PrefillPolicy,
        executor: Executor,
        dp_size: int = 1,
        gather: Gather | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.policy = policy
        self.executor = executor
        self.gather = gather
        # Before the first gather there are no rows: treat every rank as idle, which makes
        # round 0 an ALL point that opens for a prompt arriving at an idle group.
        self.last_rows: list[RankRow] = [IDLE_ROW] * dp_size
        self._vote: GateVote | None = None
        self._plan: RoundPlan | None = None

    def begin(self) -> RankRow:
        """Vote, plan and probe; returns the row this rank contributes to the gather."""
        vote = self.policy.vote(self.last_rows)
        allow = vote.open and self.scheduler.probe().wants_prefill
        plan = self.scheduler.plan(allow_prefill=allow)
        probe = self.scheduler.publish_probe()
        self._vote, self._plan = vote, plan
        return RankRow(
            plan.num_tokens,
            plan.batch_size,
            plan.num_extends,
            probe.wants_prefill,
            probe.has_decode_work,
        )

    def finish(self, rows: Sequence[RankRow]) -> RoundOutcome:
        """Observe the gathered rows, run the forward and update the scheduler."""
        vote, plan = self._vote, self._plan
        if vote is None or plan is None:
            raise RuntimeError("finish() called without begin()")
        rows = list(rows)
        self.policy.observe(rows)
        if all(row.is_idle for row in rows):
            result = RoundResult()
        else:
            result = self.executor.execute(plan, rows)
        events = self.scheduler.update(plan, result)
        self.last_rows = rows
        self._vote = self._plan = None
        return RoundOutcome(vote, plan.allow_prefill, plan, rows, result, events)

    def step(self) -> RoundOutcome:
        """One full round around this rank's ``Gather``."""
        if self.gather is None:
            raise RuntimeError("step() needs a gather; use begin()/finish() from a driver")
        row = self.begin()
        packed = self.gather.all_gather(row.pack())
        return self.finish([RankRow.unpack(p) for p in packed])
