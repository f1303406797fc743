"""The prefill role's part of a scheduler: requests leave the rank once their prompt is done.

A prefill rank (``--disaggregation-mode prefill``) schedules like a fused one, except that a
request whose last prompt chunk sampled its first token never decodes here: it leaves the
queues as a ``Handoff`` and its pages stay pinned (held by the pool under its id) until the
transfer to its decode rank ends, either way (``release``). Pinned pages count in the pool's
occupancy, so a slow or stuck decode group stops this rank admitting prompts at the 0.9
watermark instead of overwriting K/V still being read.
"""

from __future__ import annotations

from actors.control.handoff import Handoff
from actors.control.kv_pool import KVPool
from actors.control.queues import RequestQueues
from actors.control.request import Request, TokenLogprobs, sequence_id


class PrefillHandoffs:
    """Requests handed off by one prefill rank, pinned until released; one per scheduler."""

    def __init__(self, queues: RequestQueues, pool: KVPool, rank: int = 0) -> None:
        self.queues = queues
        self.pool = pool
        self.rank = rank
        # Handed-off requests whose pages are still pinned, by id.
        self.pinned: dict[str, Handoff] = {}
        # Handoffs made since the last ``take`` (the round's outcome carries them).
        self._ready: list[Handoff] = []
        self.num_handoffs = 0
        self.num_released = 0

    def hand_off(
        self,
        req: Request,
        forks: tuple[int, ...],
        logprobs: dict[str, TokenLogprobs],
    ) -> Handoff:
        """``req`` just got its first token: it leaves the queues, its pages pinned."""
        fork_logprobs = tuple(
            logprobs.get(sequence_id(req.request_id, j)) for j in range(1, len(forks) + 1)
        )
        handoff = Handoff.of(req, forks, fork_logprobs, self.rank)
        self.pinned[req.request_id] = handoff
        self._ready.append(handoff)
        self.num_handoffs += 1
        # Out of the queues, but not out of the pool: ``forget`` drops only the page table.
        self.queues.running.remove(req)
        self.queues.partial.discard(req)
        self.queues.forget(req)
        return handoff

    def release(self, request_id: str) -> bool:
        """The transfer of ``request_id`` ended (acknowledged or failed): unpin its pages.
        False for an id that holds nothing (released already, or never handed off)."""
        if self.pinned.pop(request_id, None) is None:
            return False
        self.pool.free(request_id)
        self.num_released += 1
        return True

    def take(self) -> list[Handoff]:
        """The handoffs made since the last call."""
        if not self._ready:
            return []
        ready, self._ready = self._ready, []
        return ready

    @property
    def num_pinned_pages(self) -> int:
        return sum(h.num_pages for h in self.pinned.values())
