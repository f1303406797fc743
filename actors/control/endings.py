"""How a request leaves the scheduler early: a client's abort, or a failure of its own.

Both ends take the request out of every queue and the pool and queue its final event for the
next ``Scheduler.update``; only a failure records an error for the client. Aborts may be asked
for from any thread and are applied at the start of the next plan, on the round's thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from roundgate.actors.control.admission import AdmissionWaits
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.prefix_cache import PrefixCache
from roundgate.actors.control.queues import RequestQueues
from roundgate.actors.control.request import Request, RequestStatus
from roundgate.actors.control.round import RoundPlan, TokenEvent


class RequestEnds:
    """Aborts and per-request failures on one rank: one per ``Scheduler``, over its queues."""

    def __init__(
        self,
        queues: RequestQueues,
        pool: KVPool,
        prefix: PrefixCache,
        waits: AdmissionWaits,
        free_pages: Callable[[Request], object],
    ) -> None:
        self.queues = queues
        self.pool = pool
        self.prefix = prefix
        self.waits = waits
        self.num_aborts = 0
        self.num_failures = 0
        # Request ids whose abort was asked for (any thread); applied at the next plan.
        self.pending_aborts: deque[str] = deque()
        # Final events of the requests ended since the last update, which hands them out.
        self.events: list[TokenEvent] = []
        # Retracted requests ended before readmission: their KV is parked off-device, and the
        # engine core tells the executor to let go of it (it drains this list every round).
        self.aborted_parked_ids: list[str] = []
        # How an ended request's pages go back: through the rank's KV connector, to the pool
        # at once unless a transfer still writes them (a decode rank's).
        self.free_pages = free_pages

    @property
    def has_pending(self) -> bool:
        """Whether an abort waits for the next plan or a final event for the next update."""
        return bool(self.pending_aborts or self.events)

    def abort(self, request_id: str) -> None:
        """Ask for ``request_id``'s abort (safe from any thread: one deque append)."""
        self.pending_aborts.append(request_id)

    def apply_aborts(self) -> None:
        """End every request whose abort was asked for (unknown or finished ids are skipped)."""
        pending = self.pending_aborts
        requests = self.queues.requests
        while pending:
            req = requests.get(pending.popleft())
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
        if plan is not None:
            plan.unplan(req)
        req.error = error
        self.num_failures += 1
        self._drop(req, RequestStatus.FINISHED_ERROR)

    def take_events(self) -> list[TokenEvent]:
        """The final events queued since the last call (the update hands them out)."""
        events, self.events = self.events, []
        return events

    def _drop(self, req: Request, status: RequestStatus) -> None:
        """Take ``req`` out of every queue and the pool, finished with ``status``; its
        event goes out with the next update."""
        if req in self.queues.retracted:
            # Its KV is parked off-device: the executor must let go of it too.
            self.aborted_parked_ids.append(req.request_id)
        self.queues.remove(req)
        self.free_pages(req)
        self.waits.forget(req)
        req.status = status
        self.events.append(TokenEvent(req, None, True))
