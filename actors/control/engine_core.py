"""One rank's engine: the round loop plus thread-safe intake, shared by the offline engine
and the Ray rank replica.

Requests and aborts may arrive from any thread (the replica's asyncio loop); they are queued
and applied at the start of the next round, on the thread that runs ``step``, so the
scheduler itself is only ever touched by one thread.
"""

from __future__ import annotations

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
        self._lock = threading.Lock()

    def submit(self, request: Request) -> None:
        """Queue a request for the next round (any thread); refuses, at once, a prompt that
        could never run on this rank (the ingress answers those with a 400 before).

        The rank's intake is its trust boundary: the limits are checked here, once, and
        nowhere after it (not by the scheduler's ``add_request``, not by the executor).
        """
        self.scheduler.check_fits(request)
        if self._check_request is not None:
            self._check_request(request)  # what only the executor knows (a grammar compiles)
        with self._lock:
            self._intake.append(request)

    def abort(self, request_id: str) -> None:
        """Cancel a request (any thread); its pages are freed at the next plan."""
        with self._lock:
            for req in self._intake:
                if req.request_id == request_id:
                    self._intake.remove(req)
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
            self.scheduler.add_request(request)
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
