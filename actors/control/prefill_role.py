"""The prefill role's KV connector: requests leave the rank once their prompt is done.

A prefill rank (``--disaggregation-mode prefill``) schedules like a fused one, except that a
request whose last prompt chunk sampled its first token never decodes here: it leaves the
queues as a ``Handoff`` and its pages stay pinned (held by the pool under its id) until the
transfer to its decode rank ends, either way (``HandoffReleased``). Pinned pages count in the
pool's occupancy, so a slow or stuck decode group stops this rank admitting prompts at the 0.9
watermark instead of overwriting K/V still being read. The sending end of the
``KVConnector`` interface (``roundgate.actors.control.kv_connector``); its receiving end refuses.
"""

from __future__ import annotations

from roundgate.actors.control.handoff import Handoff, HandoffReleased, TransferEnd
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.queues import RequestQueues
from roundgate.actors.control.request import Request, TokenLogprobs, sequence_id
from roundgate.actors.control.round import RoundPlan


class PrefillHandoffs:
    """Requests handed off by one prefill rank, pinned until released; one per scheduler."""

    def __init__(self, queues: RequestQueues, pool: KVPool, rank: int = 0) -> None:
        self.queues = queues
        self.pool = pool
        self.rank = rank
        # Handed-off requests whose pages are still pinned, by id.
        self.pinned: dict[str, Handoff] = {}
        # Handoffs made since the last ``take_handoffs`` (the round's outcome carries them).
        self._ready: list[Handoff] = []
        self.num_handoffs = 0
        self.num_released = 0

    # ---- the sending end ---------------------------------------------------------------

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

    def take_handoffs(self) -> list[Handoff]:
        """The handoffs made since the last call."""
        if not self._ready:
            return []
        ready, self._ready = self._ready, []
        return ready

    def is_pinned(self, request_id: str) -> bool:
        return request_id in self.pinned

    @property
    def num_pinned_pages(self) -> int:
        return sum(h.num_pages for h in self.pinned.values())

    # ---- the connector's other calls ---------------------------------------------------

    def end_transfer(self, end: TransferEnd) -> None:
        """A handoff's transfer ended: unpin its pages (a decode rank's report is refused by
        the engine core before it gets here)."""
        if isinstance(end, HandoffReleased):
            self.release(end.request_id)

    def free_pages(self, req: Request) -> None:
        self.pool.free(req.request_id)  # nothing ended here is being sent: pinned ones left

    def check_fits(self, handoff: Handoff) -> None:
        raise ValueError(f"handoff {handoff.request_id!r}: a prefill rank takes no handoffs")

    def add_handoff(self, handoff: Handoff) -> Request:
        raise ValueError(f"handoff {handoff.request_id!r}: a prefill rank takes no handoffs")

    def plan(self, plan: RoundPlan) -> None:
        return None  # it reserves nothing: its KV leaves, none arrives

    @property
    def waits_on_transfers(self) -> bool:
        return False  # its own prompts go on while its handoffs wait

    @property
    def num_waiting_for_decode(self) -> int:
        return len(self.pinned)

    @property
    def num_received(self) -> int:
        return 0
