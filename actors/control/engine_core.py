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

    def mark_loaded(self, request_id: str) -> None:
        """A ``loading`` request became schedulable (any thread; applied at the next round;
        ignored if it was aborted meanwhile)."""
        with self._lock:
            self._loaded.append(request_id)

    def _is_live(self, request_id: str) -> bool:
        """Whether ``request_id`` is queued for intake or held by the scheduler (lock held)."""
        if request_id in self.scheduler.requests:
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

    @property
    def num_unfinished(self) -> int:
        """Requests queued for the next round plus those the scheduler holds."""
        return len(self._intake) + len(self.scheduler.requests)

    @property
    def has_local_work(self) -> bool:
        return bool(self._intake) or self.scheduler.has_unfinished

    def step(self) -> RoundOutcome:
        """Take in queued requests, run one round (``RankLoop.step``), hand out its events."""
        with self._lock:
            intake, self._intake = self._intake, deque()
            for request in intake:
                self._add(request)
            loaded, self._loaded = self._loaded, deque()
        for request_id in loaded:
            self.scheduler.mark_loaded(request_id)
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
