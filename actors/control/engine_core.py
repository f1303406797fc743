"""One rank's engine: the round loop plus thread-safe intake, shared by the offline engine
and the Ray rank replica.

Requests and aborts may arrive from any thread (the replica's asyncio loop); they are queued
and applied at the start of the next round, on the thread that runs ``step``, so the
scheduler itself is only ever touched by one thread.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from actors.control.executor import Executor
from actors.control.gather import Gather, SingleRankGather
from actors.control.handoff import Handoff
from actors.control.rank_loop import RankLoop, RoundOutcome
from actors.control.request import Request
from actors.control.round import TokenEvent
from actors.control.scheduler import Scheduler
from actors.server_args import ServerArgs

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
        self.scheduler = Scheduler(args)
        if self.scheduler.handoffs is not None:
            self.scheduler.handoffs.rank = rank
        self.loop = RankLoop(
            self.scheduler,
            args.build_policy(rank),
            executor,
            args.dp_size,
            gather or SingleRankGather(),
        )
        self.on_event = on_event
        # Executors that park retracted KV off-device (the model runner) free it on abort.
        self._drop_parked = getattr(executor, "drop_parked", None)
        self._check_request = getattr(executor, "check_request", None)
        self._intake: deque[Request] = deque()
        self._loading: set[str] = set()  # ids in ``_intake`` submitted as loading
        self._loaded: deque[str] = deque()  # ``mark_loaded`` calls for the next round
        # Disaggregated roles: handoffs to take in (decode), and transfer outcomes for the
        # next round as (request id, error or None): kv_arrived / kv_failed on a decode rank,
        # release_handoff on a prefill rank.
        self._handoffs: deque[Handoff] = deque()
        self._transfers: deque[tuple[str, str | None]] = deque()
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
        if self.scheduler.intake is not None:
            raise ValueError(
                f"request {request.request_id!r}: a decode rank takes handoffs only "
                "(submit_handoff), never a prompt"
            )
        self.scheduler.check_fits(request)
        if not loading and self._check_request is not None:
            self._check_request(request)  # what only the executor knows (a grammar compiles)
        with self._lock:
            # Under the lock that also covers the move into the scheduler (``step``), so a
            # request is either queued here or held there when the next one is checked.
            if self._is_live(request.request_id):
                raise ValueError(
                    f"request id {request.request_id!r} is already in use on this rank"
                )
            self._intake.append(request)
            if loading:
                self._loading.add(request.request_id)

    def submit_handoff(self, handoff: Handoff) -> None:
        """Queue a prefill rank's handoff on this decode rank (any thread). Checked here like
        a prompt (limits, grammar); its pages are reserved by a later round, whose plan
        carries the ``KVReservation`` the transfer waits for."""
        if self.scheduler.intake is None:
            raise ValueError(
                f"handoff {handoff.request_id!r}: only a decode rank "
                f"(--disaggregation-mode decode) takes handoffs, this one is "
                f"{self.args.disaggregation_mode!r}"
            )
        request = handoff.to_request()
        self.scheduler.check_fits(request)
        self.scheduler.intake.check_fits(handoff)
        if self._check_request is not None:
            self._check_request(request)  # a grammar compiles (cached after the first)
        with self._lock:
            if self._is_live(handoff.request_id):
                raise ValueError(
                    f"request id {handoff.request_id!r} is already in use on this rank"
                )
            self._handoffs.append(handoff)

    def kv_arrived(self, request_id: str) -> None:
        """Decode rank: the reserved pages of ``request_id`` hold its KV (any thread; applied
        at the next round, from which it decodes). Unknown or ended ids are ignored."""
        with self._lock:
            self._transfers.append((request_id, None))

    def kv_failed(self, request_id: str, error: str) -> None:
        """Decode rank: the transfer of ``request_id`` failed or timed out (any thread): at
        the next round it fails alone (its final event carries ``error``), pages freed."""
        with self._lock:
            self._transfers.append((request_id, error))

    def release_handoff(self, request_id: str) -> None:
        """Prefill rank: the transfer of handed-off ``request_id`` ended, either way (any
        thread): its pinned pages are freed at the next round."""
        with self._lock:
            self._transfers.append((request_id, None))

    def mark_loaded(self, request_id: str) -> None:
        """A ``loading`` request became schedulable (any thread; applied at the next round;
        ignored if it was aborted meanwhile)."""
        with self._lock:
            self._loaded.append(request_id)

    def _is_live(self, request_id: str) -> bool:
        """Whether ``request_id`` is queued for intake or held by the scheduler (lock held)."""
        if request_id in self.scheduler.requests:
            return True
        handoffs = self.scheduler.handoffs
        if handoffs is not None and request_id in handoffs.pinned:
            return True
        if any(h.request_id == request_id for h in self._handoffs):
            return True
        return any(req.request_id == request_id for req in self._intake)

    def _add(self, request: Request) -> None:
        """Hand one request to the scheduler. ``submit`` refused duplicates already; should
        one still arrive (a caller bypassing it), it is dropped and logged, never raised:
        the round loop serves every client of the group, and one request's id must not stop
        it. (Its events could not be told from the live request's, so it gets none.)"""
        loading = request.request_id in self._loading
        self._loading.discard(request.request_id)
        try:
            self.scheduler.add_request(request, loading)
        except ValueError as exc:
            logger.error("rank %d: request dropped at intake: %s", self.rank, exc)

    def abort(self, request_id: str) -> None:
        """Cancel a request (any thread); its pages are freed at the next plan."""
        with self._lock:
            for req in self._intake:
                if req.request_id == request_id:
                    self._intake.remove(req)
                    self._loading.discard(request_id)
                    return
        self.scheduler.abort(request_id)

    def _apply_handoffs(self, handoffs: deque[Handoff], transfers: deque) -> None:
        """Take in queued handoffs and transfer outcomes (on the round's thread)."""
        intake, pinned = self.scheduler.intake, self.scheduler.handoffs
        for handoff in handoffs:
            if intake is not None:
                intake.add(handoff)
        for request_id, error in transfers:
            if pinned is not None:
                pinned.release(request_id)
            elif intake is not None and error is None:
                intake.arrived(request_id)
            elif intake is not None and error is not None:
                intake.failed(request_id, error)

    @property
    def waits_on_transfers(self) -> bool:
        """Decode rank: nothing to plan until a transfer ends (every request it holds is
        ``LOADING``, nothing queued): its loop may block instead of stepping idle rounds."""
        intake = self.scheduler.intake
        return (
            intake is not None
            and intake.only_in_flight
            and not (self._intake or self._handoffs or self._transfers)
        )

    @property
    def num_unfinished(self) -> int:
        """Requests queued for the next round plus those the scheduler holds."""
        return len(self._intake) + len(self.scheduler.requests)

    @property
    def has_local_work(self) -> bool:
        return bool(self._intake or self._handoffs or self._transfers) or (
            self.scheduler.has_unfinished
        )

    def step(self) -> RoundOutcome:
        """Take in queued requests, run one round (``RankLoop.step``), hand out its events."""
        with self._lock:
            intake, self._intake = self._intake, deque()
            for request in intake:
                self._add(request)
            loaded, self._loaded = self._loaded, deque()
            handoffs, self._handoffs = self._handoffs, deque()
            transfers, self._transfers = self._transfers, deque()
        for request_id in loaded:
            self.scheduler.mark_loaded(request_id)
        if handoffs or transfers:
            self._apply_handoffs(handoffs, transfers)
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
