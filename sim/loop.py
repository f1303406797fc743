"""The simulator's event loop, one for every kind of group: a fused group, P/D's two groups.

The loop owns what every simulated deployment does the same way: requests are sent (an
arrival list, closed-loop clients or sessions), routed when sent and handed to their rank's
scheduler ``schedule_lag_ms`` later; each round's tokens go into the request records; a
finished request lets its closed-loop client send the next one and counts towards its rank's
next stop-the-world collection. It always steps the group whose clock is behind, so what one
group hands another is seen no earlier than it was sent.

What differs by kind of group sits behind ``GroupStep``: when the group next acts, what it
takes in before a round (the loop's sends and admissions for the group requests enter), what
it does with no work, and how it runs and prices a round (``roundgate.sim.simulator`` for a fused
group, ``roundgate.sim.disaggregated`` for P/D). The loop body is the hot path: keep it lean.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.sim.arrivals import INF, Arrival, ClosedLoop, OpenLoop
from roundgate.sim.prompts import FillerPrompts
from roundgate.sim.records import RequestRecord, SimResult
from roundgate.sim.round_costs import RoundCosts
from roundgate.sim.router import Router
from roundgate.sim.sessions import SessionLoop

if TYPE_CHECKING:
    from roundgate.actors.control.round import TokenEvent
    from roundgate.actors.control.scheduler import Scheduler

ArrivalSource = OpenLoop | ClosedLoop | SessionLoop
# A round in which no rank runs a forward still costs the scheduler pass; keeps time moving.
IDLE_ROUND_MS = 0.01


class GroupStep(Protocol):
    """One group's part of the loop: its ranks, its clock and how it moves."""

    schedulers: Sequence[Scheduler]
    clock: float  # seconds; the end of the group's last round

    def next_time(self, loop: SimLoop) -> float:
        """When the group next acts (INF: not before some other group acts)."""
        ...

    def begin(self, loop: SimLoop, at: float) -> None:
        """Move the clock to ``at`` (never back) and take in what reached the group by then
        (the entry group: the loop's sends and admissions, ``intake`` or ``send_due`` and
        ``admit_due``)."""
        ...

    def idle(self, loop: SimLoop) -> bool:
        """No rank holds unfinished work after ``begin``: wait for the next event; False when
        none can come (the run is over)."""
        ...

    def step(self, loop: SimLoop) -> int:
        """Run from the clock (record tokens with ``loop.record``); returns the rounds run."""
        ...


class EntryGroup(GroupStep, Protocol):
    """The group requests enter: it chooses their rank and queues them there."""

    def route(self, loop: SimLoop, arrival: Arrival, index: int) -> int:
        """The rank request ``index`` goes to as it is sent (``loop.choose`` for the shared
        routers)."""
        ...

    def admit(self, rank: int, request: Request) -> None:
        """The request reached ``rank``'s scheduler."""
        ...


class Collector:
    """The engine processes' stop-the-world collections (``RoundCosts.gc_*``): each rank
    collects after every ``gc_period`` requests it finished, in the group's next busy round,
    which pauses for the requests that rank's batch holds as the round begins."""

    def __init__(self, costs: RoundCosts, num_ranks: int) -> None:
        self.costs = costs
        self.period = costs.gc_period()
        self.left = costs.gc_first(num_ranks)  # per rank: requests until its next collection
        self.due: list[int] = []  # ranks that collect in the next busy round
        self.count = 0  # collections made

    @classmethod
    def of(cls, costs: RoundCosts, num_ranks: int) -> Collector | None:
        """The group's collector; None when ``costs`` price no collections."""
        return cls(costs, num_ranks) if costs.gc_period() else None

    def finished(self, rank: int) -> None:
        left = self.left
        left[rank] -= 1
        if left[rank] == 0:
            self.due.append(rank)
            left[rank] = self.period

    def pause_ms(self, schedulers: Sequence[Scheduler]) -> float:
        """The due ranks' pauses, on their batches as the round begins."""
        return sum(self.costs.gc_pause_ms(len(schedulers[r].queues.running)) for r in self.due)

    def collect(self) -> None:
        """The due ranks collected (in a busy round, priced with ``pause_ms``)."""
        self.count += len(self.due)
        self.due.clear()


class SimLoop:
    """One run: the sends, the requests on their way to a rank, the records and the clock of
    rounds; ``run`` drives the groups until every request finished (or ``max_rounds``).

    ``step_times``: record the clock after each step and the ITL samples by then (a steady
    window, ``roundgate.sim.steady``); for one group only, whose steps end in time order.
    """

    def __init__(
        self,
        source: ArrivalSource,
        prompts: FillerPrompts,
        lag_s: float,
        num_ranks: int,
        step_times: bool = False,
        max_rounds: int | None = None,
        on_round: Callable[[int, int], None] | None = None,
        itl_slo_ms: float = INF,
    ) -> None:
        self.source = source
        self.closed = not isinstance(source, OpenLoop)  # finishes send follow-ups
        self.next_send = source.next_send_s
        self.prompts = prompts
        self.lag_s = lag_s
        # Sent and routed, not yet handed to the rank's scheduler: (visible_s, rank, index,
        # arrival), in send order (the lag is one constant, so also in visible order).
        self.sent: deque[tuple[float, int, int, Arrival]] = deque()
        self.in_flight = [0] * num_ranks  # per rank of the entry group: sent, not admitted
        self.records: dict[str, RequestRecord] = {}
        self.itl = array("d")
        # Each record counts its gaps above this (goodput's ITL-p99 SLO, sim/goodput.py).
        self.itl_slo_ms = itl_slo_ms
        self.finished = 0
        self.rounds = 0
        self.step_times = step_times
        self.step_end_s = array("d")
        self.step_itl = array("q")
        self.max_rounds = max_rounds
        self.on_round = on_round
        self.entry: EntryGroup | None = None

    # ---- the loop ---------------------------------------------------------------------------

    def run(self, groups: Sequence[GroupStep]) -> None:
        """Step the groups (the first is the one requests enter) until nothing is left."""
        first, rest = groups[0], groups[1:]
        self.entry = first  # type: ignore[assignment]
        max_rounds, on_round, step_times = self.max_rounds, self.on_round, self.step_times
        step_end_append, step_itl_append = self.step_end_s.append, self.step_itl.append
        itl = self.itl
        while True:
            group, at = first, first.next_time(self)
            for other in rest:  # the group whose clock is behind; ties to the earlier listed
                t = other.next_time(self)
                if t < at:
                    group, at = other, t
            if at == INF:
                break
            group.begin(self, at)
            if not any(s.has_unfinished for s in group.schedulers):
                if group.idle(self):
                    continue
                break
            if max_rounds is not None and self.rounds >= max_rounds:
                break
            self.rounds += group.step(self)
            if step_times:
                step_end_append(group.clock)
                step_itl_append(len(itl))
            if on_round is not None:
                on_round(self.rounds, self.finished)

    # ---- sends and admissions ---------------------------------------------------------------

    def intake(self, send_until: float, admit_until: float) -> None:
        """The sends due by ``send_until`` and the admissions due by ``admit_until``, in time
        order: a router reading the ranks' queues sees every request admitted before it was
        sent."""
        while True:
            self.admit_due(admit_until)
            if self.next_send > send_until:
                break
            self._send()

    def send_due(self, until: float) -> None:
        """Route every request sent by ``until``."""
        while self.next_send <= until:
            self._send()

    def admit_due(self, until: float) -> None:
        """Hand every request that reached its rank by ``until`` to the rank's scheduler."""
        sent = self.sent
        while sent and sent[0][0] <= until:
            _, rank, index, arrival = sent.popleft()
            self.in_flight[rank] -= 1
            request_id = f"req-{index}"
            sampling = SamplingParams(max_tokens=arrival.output_tokens)
            self.entry.admit(rank, Request(request_id, self.prompts.make(index, arrival), sampling))
            self.records[request_id] = RequestRecord(
                rank, arrival.time_s, arrival.prompt_tokens, turn=arrival.turn
            )

    def _send(self) -> None:
        index, arrival = self.source.pop()
        rank = self.entry.route(self, arrival, index)
        self.in_flight[rank] += 1
        self.sent.append((arrival.time_s + self.lag_s, rank, index, arrival))
        self.next_send = self.source.next_send_s

    # ---- routing ----------------------------------------------------------------------------

    def loads(self, schedulers: Sequence[Scheduler]) -> list[int]:
        """Each rank's load as its router knows it: its requests, and those on their way."""
        in_flight = self.in_flight
        return [len(s.queues.requests) + in_flight[r] for r, s in enumerate(schedulers)]

    def choose(
        self,
        router: Router,
        schedulers: Sequence[Scheduler],
        sources: list[str],
        arrival: Arrival,
        index: int,
        now_s: float,
    ) -> int:
        """The rank the kv routers (cost on the ranks' KV and loads), cache-aware (the
        prompt) or the load routers choose for request ``index`` at ``now_s``."""
        loads = self.loads(schedulers)
        session = None if arrival.session is None else str(arrival.session.session_id)
        if router.kv is not None:
            match = router.matcher(schedulers)
            prompt = self.prompts.make(index, arrival)
            return int(router.kv.choose(sources, loads, prompt, now_s, session, match).rank)
        if router.policy == "cache-aware":
            return router.route(loads, self.prompts.make(index, arrival), session)
        return router.route(loads)

    # ---- records ----------------------------------------------------------------------------

    def record(
        self,
        events: Sequence[list[TokenEvent]],
        now: float,
        schedulers: Sequence[Scheduler] | None = None,
        collector: Collector | None = None,
    ) -> None:
        """A round's tokens, rank by rank, into the records; ``schedulers`` (None: not read)
        give a first token's admission wait, ``collector`` counts the finishes per rank."""
        records = self.records
        itl_append = self.itl.append
        slo = self.itl_slo_ms
        for rank, rank_events in enumerate(events):
            for request, token_id, done in rank_events:
                rec = records[request.request_id]
                if token_id is not None:
                    if rec.first_token_s is None:
                        rec.first_token_s = now
                        if schedulers is not None:
                            rec.admission_wait = schedulers[rank].admission_wait(request)
                    else:
                        gap = (now - rec.last_token_s) * 1000.0
                        itl_append(gap)
                        if gap > slo:
                            rec.slow_gaps += 1
                    rec.last_token_s = now
                    rec.num_output += 1
                if done:
                    rec.finish_s = now
                    self.finish(request, rank, now, collector)

    def finish(
        self, request: Request, rank: int, now: float, collector: Collector | None = None
    ) -> None:
        """``request`` finished on ``rank`` at ``now`` (its record already says so)."""
        self.finished += 1
        if collector is not None:
            collector.finished(rank)
        if self.closed:
            self.source.finished(now, request)
            self.next_send = self.source.next_send_s

    def result(self, **group: object) -> SimResult:
        """The run's ``SimResult``: the loop's records and counts, ``group``'s own fields."""
        return SimResult(
            rounds=self.rounds,
            records=list(self.records.values()),
            itl_ms=self.itl,
            unfinished=len(self.records) - self.finished,
            step_end_s=self.step_end_s,
            step_itl_count=self.step_itl,
            itl_slo_ms=self.itl_slo_ms,
            **group,  # type: ignore[arg-type]
        )
