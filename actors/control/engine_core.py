"""One rank's engine: the round loop plus thread-safe intake, shared by the offline engine
and the Ray rank replica.

Requests and aborts may arrive from any thread (the replica's asyncio loop); they are queued
and applied at the start of the next round, on the thread that runs ``step``, so the
scheduler itself is only ever touched by one thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from actors.control.executor import Executor
from actors.control.gather import Gather, SingleRankGather
from actors.control.rank_loop import RankLoop, RoundOutcome
from actors.control.request import Request
from actors.control.scheduler import Scheduler, TokenEvent
from actors.policy_args import build_policy_for
from actors.server_args import ServerArgs
from gate import RankRow

EventSink = Callable[[TokenEvent], None]


class EngineCore:
    """Scheduler + policy + executor of one rank, stepped one round at a time."""

    def __init__(
        self,
        args: ServerArgs,
        executor: Executor,
        rank: int = 0,
        gather: Gather | None = None,
        max_model_len: int | None = None,
        on_event: EventSink | None = None,
    ) -> None:
        args.validate()
        self.args = args
        self.rank = rank
        self.scheduler = Scheduler(args, max_model_len)
        policy = build_policy_for(args, rank)
        self.loop = RankLoop(
            self.scheduler, policy, executor, args.dp_size, gather or SingleRankGather()
        )
        self.on_event = on_event
        # Executors that park retracted KV off-device (the model runner) free it on abort.
        self._drop_parked = getattr(executor, "drop_parked", None)
        self._intake: deque[Request] = deque()
        self._lock = threading.Lock()
        self.last_outcome: RoundOutcome | None = None
        self.last_parts: dict[str, float] = {}

    def submit(self, request: Request) -> None:
        """Queue a request for the next round (any thread). Validation errors raise here."""
        limit = self.scheduler.max_model_len
        if limit is not None and request.num_prompt_tokens + 1 > limit:
            raise ValueError(
                f"prompt of {request.num_prompt_tokens} tokens does not fit the context "
                f"length {limit}"
            )
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
        """Run one round (collectives included, if the gather has peers), timing its parts."""
        with self._lock:
            while self._intake:
                self.scheduler.add_request(self._intake.popleft())
        loop = self.loop
        t0 = time.perf_counter()
        row = loop.begin()
        t1 = time.perf_counter()
        packed = loop.gather.all_gather(row.pack())
        t2 = time.perf_counter()
        outcome = loop.finish([RankRow.unpack(p) for p in packed])
        t3 = time.perf_counter()
        forward = outcome.result.cost_s
        # schedule = vote + plan + probe; finish = observe + forward + update, less the forward.
        self.last_parts = {
            "schedule": t1 - t0,
            "gather": t2 - t1,
            "forward": forward,
            "finish": max(0.0, t3 - t2 - forward),
        }
        self.last_outcome = outcome
        parked = self.scheduler.aborted_parked_ids
        while parked:
            request_id = parked.pop()
            if self._drop_parked is not None:
                self._drop_parked(request_id)
        if self.on_event is not None:
            for event in outcome.events:
                self.on_event(event)
        return outcome
