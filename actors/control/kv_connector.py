"""The seam a request's KV crosses between ranks: one interface for both P/D roles.

Modelled on the scheduler side of vLLM's v1 KV connector, where one interface serves the end
that sends KV and the end that receives it: the receiving scheduler learns how much of a
request's KV will arrive and reserves blocks for it (``get_num_new_matched_tokens``,
``update_state_after_alloc``), and the request waits in ``WAITING_FOR_REMOTE_KVS`` until the
workers report it received; the sending scheduler, when a request finishes, keeps its blocks
until they are sent (``request_finished`` answers "delay the free"); the workers' reports
(``finished_sending`` / ``finished_recving``) come back through one update.

Here a rank's scheduler holds one connector, chosen by its role (``DisaggregationRole``)::

    role     connector        its KV   what the round asks of it
    fused    NoKVConnector    stays    nothing
    prefill  PrefillHandoffs  leaves   hand_off at a request's first token: pages pinned
                                       until its transfer ends (HandoffReleased)
    decode   HandoffIntake    arrives  add_handoff; plan reserves pages, the request waits in
                                       WAITING_FOR_REMOTE_KV until KVArrived or KVFailed

Every connector answers every call; the end it does not play does nothing (or refuses what
its role never asks of it). Whether a rank *is* a prefill or decode rank is asked of the role,
never of the connector.
"""

from __future__ import annotations

from typing import Protocol

from roundgate.actors.control.handoff import Handoff, TransferEnd
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.request import Request, TokenLogprobs
from roundgate.actors.control.round import RoundPlan


class KVConnector(Protocol):
    """A scheduler's part for KV that crosses ranks (``roundgate.actors.control.handoff``'s
    messages)."""

    # The rank's index in its group: a handoff names it as the rank that holds its pages.
    rank: int

    # ---- the receiving end (decode): KV arrives -----------------------------------------

    def check_fits(self, handoff: Handoff) -> None:
        """Refuse (``ValueError``) a handoff this rank could never take."""
        ...

    def add_handoff(self, handoff: Handoff) -> Request:
        """Queue a handoff until its pages are reserved; returns its request (sequence 0)."""
        ...

    def plan(self, plan: RoundPlan) -> None:
        """The connector's part of the round: reservations (``plan.reservations``, the
        transfers that may start) and the page copies that arrived KV needs."""
        ...

    # ---- the sending end (prefill): KV leaves -------------------------------------------

    def hand_off(
        self, req: Request, forks: tuple[int, ...], logprobs: dict[str, TokenLogprobs]
    ) -> Handoff:
        """``req`` just got its first token(s): it leaves the queues, its pages pinned."""
        ...

    def take_handoffs(self) -> list[Handoff]:
        """The handoffs made since the last call (the round's outcome carries them)."""
        ...

    def is_pinned(self, request_id: str) -> bool:
        """Whether ``request_id`` left the queues but its pages wait here for its transfer."""
        ...

    # ---- both ends ----------------------------------------------------------------------

    def end_transfer(self, end: TransferEnd) -> None:
        """Apply a transfer's end (on the round's thread): KV arrived or failed (decode),
        a handoff's pages released (prefill)."""
        ...

    def free_pages(self, req: Request) -> None:
        """``req`` ended (abort or failure): free its pages, unless a transfer still writes
        them (then they are freed when it ends)."""
        ...

    @property
    def waits_on_transfers(self) -> bool:
        """Whether every request the rank holds waits for its KV: a round could plan nothing
        (a serving loop may wait for a transfer's end instead of stepping)."""
        ...

    @property
    def num_waiting_for_decode(self) -> int:
        """Requests waiting on decode capacity: handoffs holding pinned pages until a decode
        rank takes them (prefill), handoffs waiting for pages to receive into (decode)."""
        ...

    @property
    def num_received(self) -> int:
        """Handoffs ever queued here (the decode router settles its sends on it)."""
        ...


class NoKVConnector:
    """A fused rank's connector: no KV crosses, every request prefills and decodes here."""

    def __init__(self, pool: KVPool, rank: int = 0) -> None:
        self.pool = pool
        self.rank = rank

    def check_fits(self, handoff: Handoff) -> None:
        raise ValueError(f"handoff {handoff.request_id!r}: a fused rank takes no handoffs")

    def add_handoff(self, handoff: Handoff) -> Request:
        raise ValueError(f"handoff {handoff.request_id!r}: a fused rank takes no handoffs")

    def plan(self, plan: RoundPlan) -> None:
        return None

    def hand_off(
        self, req: Request, forks: tuple[int, ...], logprobs: dict[str, TokenLogprobs]
    ) -> Handoff:
        raise ValueError(f"request {req.request_id!r}: a fused rank hands nothing off")

    def take_handoffs(self) -> list[Handoff]:
        return []

    def is_pinned(self, request_id: str) -> bool:
        return False

    def end_transfer(self, end: TransferEnd) -> None:
        return None  # nothing was in flight: an unknown id, ignored as on the other roles

    def free_pages(self, req: Request) -> None:
        self.pool.free(req.request_id)

    @property
    def waits_on_transfers(self) -> bool:
        return False

    @property
    def num_waiting_for_decode(self) -> int:
        return 0

    @property
    def num_received(self) -> int:
        return 0
