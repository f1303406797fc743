"""One rank's round, top to bottom in the order the design fixes.

    probe   = scheduler.probe()                             # fresh local read
    vote    = policy.vote(rows gathered last round, probe)   # identical on every rank
    plan    = scheduler.plan(vote.permission if probe.wants_prefill else hold)
    probe   = scheduler.publish_probe()                     # once, after the plan
    rows    = all_gather(plan summary + probe + policy's extra columns)   # the only collective
    view    = read_rows(rows)                               # the round's one reading
    policy.observe(rows, view)
    forward(plan) unless every rank is idle
    scheduler.update(plan, result)

``step`` runs exactly that around a real ``Gather`` and times its parts. An in-process driver
(the simulator) runs many ranks in one thread, so the same round is also offered split at the
gather: ``begin`` (vote, plan, probe) and ``finish`` (observe, forward, update).

With ``overlap`` (``--async-scheduling``, ``async_rounds.py``) ``finish`` queues the forward on a
worker thread and applies the *previous* round's result instead, so the next round is planned
and gathered while this one's forward runs; the vote and the rows are the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from roundgate.actors.control.async_rounds import AsyncRounds
from roundgate.actors.control.columns import column_reader
from roundgate.actors.control.executor import Executor, RoundAborted
from roundgate.actors.control.gather import Gather
from roundgate.actors.control.handoff import Handoff
from roundgate.actors.control.round import Probe, RoundPlan, RoundResult, TokenEvent
from roundgate.actors.control.scheduler import Scheduler
from roundgate.gate.permission import HOLD_ALL
from roundgate.gate.policy import PrefillPolicy
from roundgate.gate.rows import RankRow, RoundView, read_rows
from roundgate.gate.vote import GateVote

# What an empty rank's probe always says.
IDLE_PROBE = Probe(False, False)
# Distinct rows a loop remembers for reuse: rows repeat round after round, and a lookup is
# much cheaper than building a RankRow (benchmarks/bench_simulator.py: dp rows a group round).
_ROW_CACHE_SIZE = 4096
# Re-forms one round may go through mid-forward before the group gives up (a member failing
# again while the round runs again).
MAX_ABORTS = 4


@dataclass(slots=True)
class RoundOutcome:
    """What happened on this rank this round (for streaming, stats and the simulator).

    With overlapped rounds, ``result`` and ``events`` are the previous round's (applied this
    round, while this round's forward runs); the vote, plan and rows are this round's.
    """

    vote: GateVote
    plan: RoundPlan
    rows: list[RankRow]
    view: RoundView
    result: RoundResult
    events: list[TokenEvent] = field(default_factory=list)
    # A prefill rank's requests that finished their prompt this round and leave it (their
    # pages pinned until released); the reservations of a decode rank are on ``plan``.
    handoffs: list[Handoff] = field(default_factory=list)


@dataclass(slots=True)
class RoundParts:
    """Seconds spent in each part of the last ``step`` (the forward as the executor saw it)."""

    schedule: float = 0.0  # vote + plan + probe
    gather: float = 0.0
    # The forward's seconds; with overlapped rounds, only the wait for it (the part the next
    # round's host work did not hide).
    forward: float = 0.0
    finish: float = 0.0  # observe + update, less the forward
    # ``time.perf_counter()`` when the gather returned: every rank had published its row, so
    # this is the group's round boundary, the same instant on every rank up to the collective's
    # skew. Consecutive boundaries bracket one group round (the slowest rank's forward included,
    # which this rank's own parts miss: it waits for a slow peer in the *next* gather).
    gathered_at: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "schedule": self.schedule,
            "gather": self.gather,
            "forward": self.forward,
            "finish": self.finish,
        }

    @property
    def total(self) -> float:
        return self.schedule + self.gather + self.forward + self.finish


class RankLoop:
    """Drives one rank's scheduler, policy and executor round by round.

    ``clock`` (seconds) feeds the ``now_ms`` column some policies read; the simulator passes
    its simulated clock. Wall time is the default, so ranks on different hosts share an epoch.
    ``overlap``: run each forward on a worker thread, one round ahead of its update
    (``--async-scheduling``; the executor must be safe to call from that thread).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        policy: PrefillPolicy,
        executor: Executor,
        dp_size: int = 1,
        gather: Gather | None = None,
        clock: Callable[[], float] = time.time,
        overlap: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.policy = policy
        self.executor = executor
        self.gather = gather
        self.clock = clock
        extra_columns = tuple(policy.extra_columns)
        self._read_columns = column_reader(extra_columns) if extra_columns else None
        # Before the first gather there are no rows: treat every rank as idle, which makes
        # round 0 an ALL point that opens for a prompt arriving at an idle group.
        self.idle_rows: list[RankRow] = [
            RankRow(0, 0, 0, False, False, (0,) * len(extra_columns))
        ] * dp_size
        self.idle_view = read_rows(self.idle_rows)
        self.last_rows: list[RankRow] = self.idle_rows
        self.parts = RoundParts()
        self._vote: GateVote | None = None
        self._plan: RoundPlan | None = None
        self._rows: dict[tuple, RankRow] = {}
        self.overlapped = AsyncRounds(scheduler, executor) if overlap else None

    def step(self) -> RoundOutcome:
        """One full round around this rank's ``Gather``, with its parts timed."""
        if self.gather is None:
            raise RuntimeError("step() needs a gather; use begin()/finish() from a driver")
        t0 = time.perf_counter()
        row = self.begin()
        t1 = time.perf_counter()
        for attempt in range(MAX_ABORTS + 1):
            rows = [RankRow.unpack(p) for p in self.gather.all_gather(row.pack())]
            t2 = time.perf_counter()
            try:
                outcome = self.finish(rows)
                break
            except RoundAborted:  # re-formed mid-forward: the same row, the new group
                if attempt == MAX_ABORTS:
                    raise
        t3 = time.perf_counter()
        parts = self.parts
        overlapped = self.overlapped
        forward = outcome.result.cost_s if overlapped is None else overlapped.last_wait_s
        parts.schedule, parts.gather, parts.forward = t1 - t0, t2 - t1, forward
        parts.gathered_at = t2
        parts.finish = max(0.0, t3 - t2 - forward)
        return outcome

    def begin(self) -> RankRow:
        """Vote, plan and probe; returns the row this rank contributes to the gather."""
        scheduler = self.scheduler
        if not scheduler.has_unfinished and self._read_columns is None:
            # An empty rank (common: most ranks of a lightly loaded group): the same steps
            # with their known outcome. The policy still votes, so its state advances.
            self._vote = self.policy.vote(self.last_rows, IDLE_PROBE)
            self._plan = scheduler.plan(HOLD_ALL)
            return self.idle_rows[0]
        local = scheduler.probe()
        vote = self.policy.vote(self.last_rows, local)
        plan = scheduler.plan(vote.permission if local.wants_prefill else HOLD_ALL)
        probe = scheduler.publish_probe()
        self._vote, self._plan = vote, plan
        extras = () if self._read_columns is None else self._read_columns(scheduler, self.clock())
        batch_size, num_extends, _, num_tokens = plan.counts()
        key = (
            num_tokens,
            batch_size,
            num_extends,
            probe.wants_prefill,
            probe.has_decode_work,
            extras,
        )
        row = self._rows.get(key)
        if row is None:
            if len(self._rows) >= _ROW_CACHE_SIZE:
                self._rows.clear()
            row = self._rows[key] = RankRow(*key)
        return row

    def finish(self, rows: Sequence[RankRow], view: RoundView | None = None) -> RoundOutcome:
        """Observe the gathered rows, run the forward and update the scheduler.

        ``view`` is the rows' reading when the caller already has it (the simulator reads a
        round's rows once for all its ranks).
        """
        vote, plan = self._vote, self._plan
        if vote is None or plan is None:
            raise RuntimeError("finish() called without begin()")
        rows = list(rows)
        if view is None:
            view = read_rows(rows)
        self.policy.observe(rows, view)
        scheduler = self.scheduler
        if self.overlapped is not None:
            result, events = self.overlapped.run(plan, rows, view)
        else:
            result = RoundResult() if view.all_idle else self.executor.execute(plan, rows, view)
            events = scheduler.update(plan, result)
        self.last_rows = rows
        self._vote = self._plan = None
        handoffs = scheduler.connector.take_handoffs()  # a prefill rank's, made this round
        return RoundOutcome(vote, plan, rows, view, result, events, handoffs)

    @property
    def has_in_flight(self) -> bool:
        """Whether a forward's result is still to be applied (overlapped rounds): the rank
        must step again, idle or not, to hand out its events."""
        return self.overlapped is not None and self.overlapped.in_flight is not None

    def close(self) -> None:
        """Let the forward thread go (overlapped rounds; a no-op otherwise)."""
        if self.overlapped is not None:
            self.overlapped.close()

    def regroup(self, policy: PrefillPolicy, dp_size: int) -> None:
        """A new membership (elastic DP): the policy starts over on the new group's rows, as
        on a group's first round (every rank idle: round 0 is an ALL point). Called inside a
        round's gather; the round's vote and plan stand, and ``finish`` observes the new
        group's rows with the new policy."""
        if tuple(policy.extra_columns) != tuple(self.policy.extra_columns):
            raise ValueError("regroup: the policy's gather columns must not change")
        self.policy = policy
        self.idle_rows = [self.idle_rows[0]] * dp_size
        self.idle_view = read_rows(self.idle_rows)
        self.last_rows = self.idle_rows

    def observe_idle(self) -> None:
        """Stand in for the idle rounds a group runs while no rank has anything to do.

        A live group keeps stepping with all-idle rows between bursts (every rank sees them);
        a driver that skips that time (the simulator jumps its clock) calls this once instead,
        so the policy's state after the gap is what the engine's would be.
        """
        self.policy.observe(self.idle_rows, self.idle_view)
        self.last_rows = self.idle_rows
