"""Where each of a rank's requests is: the queues the scheduler and its parts share.

The scheduler owns one ``RequestQueues`` and hands it to its planner (which admits, readmits
and retracts) and its endings part (which drops aborted and failed requests); the update after
the forward finishes requests out of it. Each part moves requests between the queues; none
rebinds them, so every holder sees the same lists.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from roundgate.actors.control.request import Request, RequestStatus


@dataclass(slots=True)
class RequestQueues:
    """A rank's unfinished requests, by where they are in their life on the rank."""

    # Prompts not admitted yet, in arrival order; one still LOADING (a grammar compiling)
    # is passed over until it is schedulable, so it never holds up the prompts behind it.
    waiting: deque[Request] = field(default_factory=deque)
    # Requests holding pages, in admission order (KV pressure retracts the newest).
    running: list[Request] = field(default_factory=list)
    # The running requests whose prompt is not fully computed (resident prefill chunks),
    # kept in step with ``running`` so the probe is O(1) instead of a scan per round.
    partial: set[Request] = field(default_factory=set)
    # Requests whose pages were taken back under KV pressure, readmitted oldest first.
    retracted: deque[Request] = field(default_factory=deque)
    # The status each retracted request resumes with at readmission.
    resume_status: dict[str, RequestStatus] = field(default_factory=dict)
    # Every unfinished request of the rank, by id.
    requests: dict[str, Request] = field(default_factory=dict)

    def first_schedulable(self) -> Request | None:
        """The oldest waiting prompt that is neither still loading nor waiting for its KV
        from another rank (None: none is)."""
        for req in self.waiting:
            if req.status is RequestStatus.WAITING:
                return req
        return None

    def take_waiting(self, req: Request) -> None:
        """Take an admitted prompt out of ``waiting`` (the head, unless loading ones precede)."""
        if self.waiting[0] is req:
            self.waiting.popleft()
        else:
            self.waiting.remove(req)

    def retire(self, req: Request) -> None:
        """A running request finished (its pages already freed): it leaves the rank."""
        self.running.remove(req)
        self.partial.discard(req)
        self.forget(req)

    def remove(self, req: Request) -> None:
        """Take ``req`` out of whichever queue holds it (its pages already freed)."""
        for queue in (self.waiting, self.running, self.retracted):
            if req in queue:
                queue.remove(req)
        self.partial.discard(req)
        self.resume_status.pop(req.request_id, None)
        self.forget(req)

    def forget(self, req: Request) -> None:
        """Drop ``req``'s id and its page table: nothing on the rank refers to it any more."""
        req.page_ids = []
        self.requests.pop(req.request_id, None)
