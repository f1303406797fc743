"""One rank's engine: the round loop plus thread-safe intake, shared by the offline engine
and the Ray rank replica.

Requests and aborts may arrive from any thread (the replica's asyncio loop); they are queued
and applied at the start of the next round, on the thread that runs ``step``, so the
scheduler itself is only ever touched by one thread. So are a disaggregated rank's inbound
handoffs (decode) and the ends of its transfers (``KVArrived``/``KVFailed`` on a decode rank,
``HandoffReleased`` on a prefill rank), which its scheduler's KV connector applies.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from roundgate.actors.control import async_rounds
from roundgate.actors.control.config import SchedulerConfig
from roundgate.actors.control.executor import Executor
from roundgate.actors.control.gather import Gather, SingleRankGather
from roundgate.actors.control.handoff import (
    Handoff,
    HandoffReleased,
    KVArrived,
    KVFailed,
    TransferEnd,
)
from roundgate.actors.control.rank_loop import RankLoop, RoundOutcome
from roundgate.actors.control.request import Request
from roundgate.actors.control.round import TokenEvent
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.server_args import ServerArgs

EventSink = Callable[[TokenEvent], None]
logger = logging.getLogger("roundgate.engine")


class EngineCore:
    """Scheduler + policy + executor of one rank, stepped one round at a time.

    ``args`` is already validated (a ``ServerArgs`` always is); the context length is its
    ``max_model_len``, the same number the ingress checks prompts against.
    """

    def __init__(
        self,
        args: ServerArgs,
        executor: Executor,
        rank: int = 0,
        gather: Gather | None = None,
        on_event: EventSink | None = None,
    ) -> None:
        self.args = args
        self.rank = rank
        self.scheduler = Scheduler(SchedulerConfig.from_args(args))
        self.role = args.disaggregation_mode
        # Where the rank's KV crosses to or from other ranks (a no-op on a fused rank).
        self.connector = self.scheduler.connector
        self.connector.rank = rank  # a prefill rank's handoffs name it as their source
        self.loop = RankLoop(
            self.scheduler,
            args.build_policy(rank),
            executor,
            args.dp_size,
            gather or SingleRankGather(),
            overlap=args.async_scheduling,
        )
        self.on_event = on_event
        # Executors that park retracted KV off-device (the model runner) free it on abort.
        self._drop_parked = getattr(executor, "drop_parked", None)
        self._check_request = getattr(executor, "check_request", None)
        # What the next round takes in, queued by any thread (under ``_lock``): prompts, the
        # ids among them submitted as loading, ``mark_loaded`` calls; on a decode rank the
        # handoffs coming in, and on either disaggregated role the ends of transfers.
        self._queued_prompts: deque[Request] = deque()
        self._loading_ids: set[str] = set()
        self._loaded_ids: deque[str] = deque()
        self._queued_handoffs: deque[Handoff] = deque()
        self._transfer_ends: deque[TransferEnd] = deque()
        self._lock = threading.Lock()

    def submit(self, request: Request, loading: bool = False) -> None:
        """Queue a request for the next round (any thread); refuses, at once, a prompt that
        could never run on this rank (the ingress answers those with a 400 before).

        The rank's intake is its trust boundary: the limits are checked here, once, and
        nowhere after it (not by the scheduler's ``add_request``, not by the executor).
        ``loading``: the request still waits on something off the engine thread (its grammar
        compiling); it holds its place in the scheduler's ``LOADING`` state until
        ``mark_loaded``, and the executor's own check is the caller's to run.
        """
        if self.role is DisaggregationRole.DECODE:
            raise ValueError(
                f"request {request.request_id!r}: a decode rank takes handoffs only "
                "(submit_handoff), never a prompt"
            )
        self.scheduler.check_fits(request)
        if self.args.async_scheduling:
            async_rounds.check_request(request)  # what overlapped rounds cannot plan
        if not loading and self._check_request is not None:
            self._check_request(request)  # what only the executor knows (a grammar compiles)
        with self._lock:
            # Under the lock that also covers the move into the scheduler (``step``), so a
            # request is either queued here or held there when the next one is checked.
            if self._is_live(request.request_id):
                raise ValueError(
                    f"request id {request.request_id!r} is already in use on this rank"
                )
            self._queued_prompts.append(request)
            if loading:
                self._loading_ids.add(request.request_id)

    def submit_handoff(self, handoff: Handoff) -> None:
        """Queue a prefill rank's handoff on this decode rank (any thread). Checked here like
        a prompt (limits, grammar); its pages are reserved by a later round, whose plan
        carries the ``KVReservation`` the transfer waits for."""
        self._check_role(
            DisaggregationRole.DECODE, f"handoff {handoff.request_id!r}", "takes handoffs"
        )
        request = handoff.to_request()
        self.scheduler.check_fits(request)
        self.connector.check_fits(handoff)
        if self._check_request is not None:
            self._check_request(request)  # a grammar compiles (cached after the first)
        with self._lock:
            if self._is_live(handoff.request_id):
                raise ValueError(
                    f"request id {handoff.request_id!r} is already in use on this rank"
                )
            self._queued_handoffs.append(handoff)

    def kv_arrived(self, request_id: str) -> None:
        """Decode rank: the reserved pages of ``request_id`` hold its KV (any thread; applied
        at the next round, from which it decodes). Unknown or ended ids are ignored."""
        self._end_transfer(KVArrived(request_id), DisaggregationRole.DECODE, "receives KV")

    def kv_failed(self, request_id: str, error: str) -> None:
        """Decode rank: the transfer of ``request_id`` failed or timed out (any thread): at
        the next round it fails alone (its final event carries ``error``), pages freed."""
        self._end_transfer(
            KVFailed(request_id=request_id, error=error), DisaggregationRole.DECODE, "receives KV"
        )

    def release_handoff(self, request_id: str) -> None:
        """Prefill rank: the transfer of handed-off ``request_id`` ended, either way (any
        thread): its pinned pages are freed at the next round."""
        self._end_transfer(
            HandoffReleased(request_id), DisaggregationRole.PREFILL, "pins handed-off pages"
        )

    def _end_transfer(self, end: TransferEnd, role: DisaggregationRole, does: str) -> None:
        """Queue a transfer's end for the next round; only ``role``'s rank has transfers
        that end this way (the message is refused on any other, naming the flag)."""
        self._check_role(role, f"request {end.request_id!r}", does)
        with self._lock:
            self._transfer_ends.append(end)

    def _check_role(self, role: DisaggregationRole, what: str, does: str) -> None:
        """Refuse what only ``role``'s rank ``does``, naming the flag that sets the role."""
        if self.role is not role:
            raise ValueError(
                f"{what}: only a {role} rank (--disaggregation-mode {role}) {does}, this one "
                f"is {self.role}"
            )

    def mark_loaded(self, request_id: str) -> None:
        """A ``loading`` request became schedulable (any thread; applied at the next round;
        ignored if it was aborted meanwhile)."""
        with self._lock:
            self._loaded_ids.append(request_id)

    def _is_live(self, request_id: str) -> bool:
        """Whether ``request_id`` is queued for intake or held by the scheduler (lock held)."""
        if request_id in self.scheduler.queues.requests or self.connector.is_pinned(request_id):
            return True
        if any(h.request_id == request_id for h in self._queued_handoffs):
            return True
        return any(req.request_id == request_id for req in self._queued_prompts)

    def _add(self, request: Request) -> None:
        """Hand one request to the scheduler. ``submit`` refused duplicates already; should
        one still arrive (a caller bypassing it), it is dropped and logged, never raised:
        the round loop serves every client of the group, and one request's id must not stop
        it. (Its events could not be told from the live request's, so it gets none.)"""
        loading = request.request_id in self._loading_ids
        self._loading_ids.discard(request.request_id)
        try:
            self.scheduler.add_request(request, loading)
        except ValueError as exc:
            logger.error("rank %d: request dropped at intake: %s", self.rank, exc)

    def abort(self, request_id: str) -> None:
        """Cancel a request (any thread); its pages are freed at the next plan."""
        with self._lock:
            for req in self._queued_prompts:
                if req.request_id == request_id:
                    self._queued_prompts.remove(req)
                    self._loading_ids.discard(request_id)
                    return
        self.scheduler.abort(request_id)

    def _apply_kv(self, handoffs: deque[Handoff], ends: deque[TransferEnd]) -> None:
        """Hand queued inbound handoffs and transfer ends to the connector (on the round's
        thread; each was checked against the rank's role when it was queued)."""
        connector = self.connector
        for handoff in handoffs:
            connector.add_handoff(handoff)
        for end in ends:
            connector.end_transfer(end)

    @property
    def waits_on_transfers(self) -> bool:
        """Decode rank: nothing to plan until a transfer ends (every request it holds is
        ``WAITING_FOR_REMOTE_KV``, nothing queued): its loop may block instead of stepping
        idle rounds."""
        return self.connector.waits_on_transfers and not (
            self._queued_prompts or self._queued_handoffs or self._transfer_ends
        )

    @property
    def num_unfinished(self) -> int:
        """Requests queued for the next round plus those the scheduler holds."""
        return len(self._queued_prompts) + len(self.scheduler.queues.requests)

    @property
    def has_local_work(self) -> bool:
        """Anything queued or held, or (overlapped rounds) a forward whose result is still to
        be applied."""
        return bool(self._queued_prompts or self._queued_handoffs or self._transfer_ends) or (
            self.scheduler.has_unfinished or self.loop.has_in_flight
        )

    def step(self) -> RoundOutcome:
        """Take in queued requests, run one round (``RankLoop.step``), hand out its events."""
        with self._lock:
            prompts, self._queued_prompts = self._queued_prompts, deque()
            for request in prompts:
                self._add(request)
            loaded, self._loaded_ids = self._loaded_ids, deque()
            handoffs, self._queued_handoffs = self._queued_handoffs, deque()
            ends, self._transfer_ends = self._transfer_ends, deque()
        for request_id in loaded:
            self.scheduler.mark_loaded(request_id)
        if handoffs or ends:
            self._apply_kv(handoffs, ends)
        outcome = self.loop.step()
        parked = self.scheduler.aborted_parked_ids
        while parked:
            request_id = parked.pop()
            if self._drop_parked is not None:
                self._drop_parked(request_id)
        if self.on_event is not None:
            for event in outcome.events:
                self.on_event(event)
        return outcome
