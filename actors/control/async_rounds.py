"""Overlapped rounds (``--async-scheduling``): round N+1 is planned while round N's forward runs.

Without overlap a rank's round is plan -> gather -> forward -> update, and the host parts (the
vote, the plan, the probe, the gather, the update) add to every forward. With it, the forward
runs on one worker thread and the rank's thread goes on at once::

    rank thread   plan N+1 | gather | observe | queue fwd N+1 | wait N, resolve N | advance N+1
    worker              ... forward N ..............| fill N+1's tokens from N | forward N+1 ...

- ``queue fwd N+1``: the plan is copied (each request's token and page lists: ``snapshot``) so
  the rank thread may change its requests while the forward reads the copy.
- ``fill``: on the worker, right before forward N+1, the placeholders of round N's tokens in
  the copy take their values from round N's result (the worker's previous one; on a GPU this
  is where the sampled-token tensor would be read). A request whose round N token stopped it
  (or whose round N failed) leaves the copy: its round N+1 output is discarded.
- ``resolve`` / ``advance``: the scheduler's update, split around the gap (``PendingTokens``).

The gate is untouched: it votes on the rows gathered last round, and the rows are the plans'
summaries, which ``advance`` keeps equal to the synchronous ones except after a stop token or a
failure (that request is counted in one more round's row). Refused, because they need round N's
token values to *plan* round N+1 or rerun a round: speculative decoding, the P/D roles and an
MoE group's expert collectives beside the gather (``ServerArgs``), grammars and ``n > 1``
(per request, ``check_request``), and an elastic group's mid-forward re-form (``RoundAborted``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from roundgate.actors.control.executor import Executor, RoundAborted
from roundgate.actors.control.pending_tokens import PLACEHOLDER, PendingToken, PendingTokens
from roundgate.actors.control.request import Request
from roundgate.actors.control.round import RoundPlan, RoundResult, ScheduledChunk, TokenEvent
from roundgate.actors.control.scheduler import Scheduler
from roundgate.gate.rows import RankRow, RoundView

FLAG = "--async-scheduling"


def check_request(request: Request) -> None:
    """Refuse, naming the flag, a request whose next round needs its last token to be *planned*:
    a grammar (its matcher lives on the request and advances with each token) or ``n > 1`` (its
    sequences are forked from the first token's result)."""
    sampling = request.sampling
    if sampling.grammar is not None:
        raise ValueError(
            f"request {request.request_id!r}: structured output is not supported with {FLAG} "
            "(the grammar must advance on each token before the next round is planned)"
        )
    if sampling.n > 1:
        raise ValueError(
            f"request {request.request_id!r}: n={sampling.n} is not supported with {FLAG} "
            "(the sequences fork from the first token's result)"
        )


@dataclass(slots=True)
class InFlightRound:
    """A round whose forward is queued or running: its plan as the scheduler holds it, its
    placeholders, and its result twice: ``done`` when its forward returns, ``handed`` when
    the next round's forward has taken its tokens and started (see ``AsyncRounds.run``)."""

    plan: RoundPlan
    pending: list[PendingToken]
    done: Future[RoundResult]
    handed: Future[RoundResult] = field(default_factory=Future)


def snapshot(plan: RoundPlan) -> RoundPlan:
    """The plan as the forward reads it: each request copied with its own token and page lists,
    so planning the next round (which appends tokens, grows and frees pages) cannot change what
    this forward sees. The copy's other fields are the request's own (never mutated)."""
    copies: dict[int, Request] = {}

    def copy(req: Request) -> Request:
        twin = copies.get(id(req))
        if twin is None:
            twin = object.__new__(Request)
            twin.__dict__.update(req.__dict__)
            twin.output_token_ids = list(req.output_token_ids)
            twin.page_ids = list(req.page_ids)
            copies[id(req)] = twin
        return twin

    chunks = [
        ScheduledChunk(copy(c.request), c.start, c.num_tokens, c.is_prefill) for c in plan.chunks
    ]
    return RoundPlan(
        chunks=chunks,
        retracted=list(plan.retracted),  # (request, its old page ids): a copy already
        readmitted=[copy(req) for req in plan.readmitted],
        page_copies=list(plan.page_copies),
        reservations=list(plan.reservations),
        permission=plan.permission,
    )


def fill_tokens(plan: RoundPlan, previous: RoundResult) -> None:
    """Give the copied plan the tokens its requests sampled last round (their placeholders), and
    drop the chunks of requests that round ended: a stop token or a failure."""
    sampled = previous.sampled
    kept: list[ScheduledChunk] = []
    for chunk in plan.chunks:
        req = chunk.request
        output = req.output_token_ids
        if output and output[-1] == PLACEHOLDER:
            token = sampled.get(req.request_id)
            if token is None or token in req.sampling.stop_token_ids:
                continue
            output[-1] = token
        kept.append(chunk)
    if len(kept) != len(plan.chunks):
        plan.chunks[:] = kept


class AsyncRounds:
    """One rank's overlapped rounds: the worker thread, the round in flight, and the split
    update. ``RankLoop`` hands it each round after the gather (``run``)."""

    def __init__(self, scheduler: Scheduler, executor: Executor) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.tokens = PendingTokens(scheduler)
        self.in_flight: InFlightRound | None = None
        # Seconds the rank thread last waited for a forward (the part of it not overlapped).
        self.last_wait_s = 0.0
        # One worker: forwards run one at a time, in round order, which is what lets a
        # forward take its tokens from the one before it and reuse pages freed meanwhile.
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="roundgate-forward")

    def run(
        self, plan: RoundPlan, rows: Sequence[RankRow], view: RoundView
    ) -> tuple[RoundResult, list[TokenEvent]]:
        """Queue this round's forward, then apply the previous round's result; returns that
        result and its events (empty on the first round)."""
        if view.all_idle:
            # Nobody runs a forward (the plan has no chunks), as in the synchronous round: only
            # the final events of requests this plan ended (aborts) go out, now.
            result, events = self.settle(None)
            ends = self.scheduler.ends
            if ends.events:
                events.extend(ends.take_events())
            return result, events
        previous = self.in_flight
        done = self._worker.submit(self._forward, snapshot(plan), list(rows), view, previous)
        result, events = self.settle(plan)
        self.in_flight = InFlightRound(plan, self.tokens.advance(plan), done)
        return result, events

    def settle(self, successor: RoundPlan | None = None) -> tuple[RoundResult, list[TokenEvent]]:
        """Wait for the round in flight and apply its result (nothing in flight: nothing).

        ``successor``: the next round's plan, its forward queued. Then the wait ends when that
        forward has started (the worker hands the result over only then, so this thread's
        host work cannot hold the GIL between the two forwards), and the requests the result
        ends leave that plan, as they left the forward's copy.
        """
        round_ = self.in_flight
        if round_ is None:
            self.last_wait_s = 0.0
            return RoundResult(), []
        self.in_flight = None
        started = time.perf_counter()
        try:
            result = (round_.done if successor is None else round_.handed).result()
        except RoundAborted as exc:
            raise RuntimeError(
                f"{FLAG}: the group re-formed during a forward whose next round was already "
                "queued; a re-formed round is rerun only with synchronous rounds"
            ) from exc
        self.last_wait_s = time.perf_counter() - started
        return result, self.tokens.resolve(round_.plan, round_.pending, result, successor)

    def _forward(
        self,
        plan: RoundPlan,
        rows: list[RankRow],
        view: RoundView,
        previous: InFlightRound | None,
    ) -> RoundResult:
        """On the worker: the previous round's tokens in, that result handed over, this
        round's forward run. The worker is serial, so ``previous`` is done already."""
        if previous is not None:
            try:
                last = previous.done.result()
            except BaseException as exc:
                previous.handed.set_exception(exc)
                raise
            fill_tokens(plan, last)
            previous.handed.set_result(last)
        return self.executor.execute(plan, rows, view)

    def close(self) -> None:
        """Stop the worker once the forward in flight (if any) is done."""
        self._worker.shutdown(wait=True)
