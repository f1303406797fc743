"""How a request leaves the scheduler early: a client's abort, or a failure of its own.

A mixin of ``Scheduler`` (its queues, pool and counters), kept apart so the scheduler module
holds the round itself. Both ends take the request out of every queue and the pool and queue
its final event for the next ``update``; only a failure records an error for the client.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from actors.control.admission import AdmissionWaits
from actors.control.kv_pool import KVPool
from actors.control.prefix_cache import PrefixCache
from actors.control.request import Request, RequestStatus
from actors.control.round import RoundPlan, TokenEvent


class RequestEnds:
    """Aborts and per-request failures (the scheduler's bookkeeping for both)."""

    pool: KVPool
    prefix: PrefixCache
    waiting: deque[Request]
    running: list[Request]
    retracted: deque[Request]
    requests: dict[str, Request]
    waits: AdmissionWaits
    num_aborts: int
    num_failures: int
    aborted_parked_ids: list[str]
    _pending_aborts: deque[str]
    _aborted_events: list[TokenEvent]
    _partial: set[Request]
    _resume_status: dict[str, RequestStatus]

    if TYPE_CHECKING:  # provided by ``RoundPlanner``

        def _unplan(self, req: Request, plan: RoundPlan) -> None: ...

    def _apply_aborts(self) -> None:
        while self._pending_aborts:
            req = self.requests.get(self._pending_aborts.popleft())
            if req is None or req.is_finished:
                continue
            self.num_aborts += 1
            if self.prefix.enabled and req.page_ids:
                self.prefix.keep_last_page(req)  # what it computed stays reusable
            self._drop(req, RequestStatus.FINISHED_ABORTED)

    def fail(self, req: Request, error: str, plan: RoundPlan | None = None) -> None:
        """Finish ``req`` alone with ``error`` (its planning or its forward raised); the
        rank's other requests and the group carry on. Its chunks leave ``plan``."""
        if req.is_finished:
            return
        if plan is not None and any(c.request is req for c in plan.chunks):
            self._unplan(req, plan)
        req.error = error
        self.num_failures += 1
        self._drop(req, RequestStatus.FINISHED_ERROR)

    def _drop(self, req: Request, status: RequestStatus) -> None:
        """Take ``req`` out of every queue and the pool, finished with ``status``; its
        event goes out with the next update."""
        if req in self.retracted:
            # Its KV is parked off-device: the executor must let go of it too.
            self.aborted_parked_ids.append(req.request_id)
        for queue in (self.waiting, self.running, self.retracted):
            if req in queue:
                queue.remove(req)
        self._partial.discard(req)
        self.pool.free(req.request_id)
        self._resume_status.pop(req.request_id, None)
        self.waits.forget(req)
        req.status = status
        self._finish(req)
        self._aborted_events.append(TokenEvent(req, None, True))

    def _finish(self, req: Request) -> None:
        req.page_ids = []
        self.requests.pop(req.request_id, None)
