"""The decode role's KV connector: requests arrive with their KV and only decode.

A decode rank (``--disaggregation-mode decode``) never prefills. Its new work is handoffs
(``roundgate.actors.control.handoff``), each in one of three places::

    add_handoff ─► waiting (WAITING) ──(pool <= 0.9, slots free, pages fit)──► waiting
                   reserve: pages held, KVReservation out          (WAITING_FOR_REMOTE_KV)
                                                                          │ transfer runs
                                                                          ▼
        fail: FINISHED_ERROR, pages freed ◄── KVFailed            KVArrived ──► running (DECODING)

Reservation is admission: the 0.9 watermark and the batch's slots apply as to a new prompt on
a fused rank, and a handoff that does not fit waits (the head holds the queue, as prompts do),
so no transfer ever targets a full pool. Prefix caching reuses the pages this rank already
holds for the prompt's leading full pages; only the others move. ``n > 1`` reserves, for
sequences 1..n-1, the parent's full prompt pages shared (refcounted, read-only: decodes write
past the prompt) plus one private page each, into which the parent's partial last page is
copied when the KV has arrived; their first tokens came with the handoff.

A request that ends while its transfer runs (a client's abort) keeps its pages until the
transfer ends either way: the transport is still writing them. The receiving end of the
``KVConnector`` interface (``roundgate.actors.control.kv_connector``); its sending end refuses.
"""

from __future__ import annotations

from collections.abc import Callable

from roundgate.actors.control.endings import RequestEnds
from roundgate.actors.control.handoff import (
    Handoff,
    KVArrived,
    KVFailed,
    KVReservation,
    TransferEnd,
)
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.page_keys import PageKey
from roundgate.actors.control.prefix_cache import PrefixCache
from roundgate.actors.control.queues import RequestQueues
from roundgate.actors.control.request import Request, RequestStatus, TokenLogprobs, sequence_id
from roundgate.actors.control.round import RoundPlan, TokenEvent

_WAITING = RequestStatus.WAITING
_WAITING_FOR_KV = RequestStatus.WAITING_FOR_REMOTE_KV
_DECODING = RequestStatus.DECODING


class HandoffIntake:
    """A decode rank's handoffs from arrival to their first decode; one per scheduler."""

    def __init__(
        self,
        queues: RequestQueues,
        pool: KVPool,
        prefix: PrefixCache,
        ends: RequestEnds,
        max_batch_size: int,
        watermark: float,
        max_sequence_len: int | None,
        retire: Callable[[Request], None],
    ) -> None:
        self.queues = queues
        self.pool = pool
        self.prefix = prefix
        self.ends = ends
        self.max_batch_size = max_batch_size
        self.watermark = watermark
        self.max_sequence_len = max_sequence_len
        self.retire = retire  # the scheduler's: a sequence that finished at its first token
        self.rank = 0  # its index in the decode group (no message of this side names it)
        self._handoff_of: dict[str, Handoff] = {}  # waiting, reserved or not, by id
        # Reserved requests (their transfer under way) and the forks reserved with them.
        self.in_flight: dict[str, Request] = {}
        self._forks: dict[str, list[Request]] = {}
        # Ended while in flight: their pages are freed when the transfer ends.
        self._orphans: set[str] = set()
        # Pages to copy before the next forward: a fork's private copy of the last page.
        self._copies: list[tuple[int, int]] = []
        # A finished sequence 0's last page, held for the copies read from it: queued (for the
        # next plan) and planned (freed at the plan after, once the copies have run).
        self._copy_holds: list[str] = []
        self._planned_holds: list[str] = []
        self.num_reserved = 0
        self.num_received = 0  # handoffs ever queued (the decode router settles sends on it)
        self.num_transferred_pages = 0
        self.num_cached_pages = 0

    # ---- intake ------------------------------------------------------------------------

    def add_handoff(self, handoff: Handoff) -> Request:
        """Queue a handoff for reservation; returns its request (sequence 0)."""
        req = handoff.to_request()
        self.num_received += 1
        self._handoff_of[req.request_id] = handoff
        self.queues.requests[req.request_id] = req
        self.queues.waiting.append(req)
        return req

    def check_fits(self, handoff: Handoff) -> None:
        """Refuse a handoff this rank's whole pool could never hold (its prompt and first
        token, plus a private page for each fork): it would wait forever."""
        need = self.pool.pages_for(len(handoff.prompt_token_ids) + 1) + handoff.sampling.n - 1
        if need > self.pool.num_pages:
            raise ValueError(
                f"handoff {handoff.request_id!r} needs {need} KV pages (prompt of "
                f"{len(handoff.prompt_token_ids)} tokens, n={handoff.sampling.n}); the decode "
                f"rank has {self.pool.num_pages}"
            )

    @property
    def num_in_flight_sequences(self) -> int:
        return sum(req.sampling.n for req in self.in_flight.values())

    @property
    def waits_on_transfers(self) -> bool:
        """Whether every request the rank holds waits for its KV: a round could plan nothing
        (a serving loop may wait for ``kv_arrived`` / ``kv_failed`` instead of stepping)."""
        queues = self.queues
        return (
            bool(self.in_flight)
            and len(self.in_flight) == len(self._handoff_of)
            and not queues.running
            and not queues.retracted
            and not self.ends.has_pending
        )

    @property
    def num_waiting_for_decode(self) -> int:
        """Handoffs waiting for decode capacity (not yet reserved)."""
        return len(self._handoff_of) - len(self.in_flight)

    # ---- the round ---------------------------------------------------------------------

    def plan(self, plan: RoundPlan) -> None:
        """The round's page copies for forks that arrived, and reservations for waiting
        handoffs, oldest first, while the pool and the batch allow."""
        for owner in self._planned_holds:  # their copies ran in the last round
            self.pool.free(owner)
        self._planned_holds = self._copy_holds
        self._copy_holds = []
        if self._copies:
            plan.page_copies.extend(self._copies)
            self._copies.clear()
        if len(self.in_flight) == len(self._handoff_of):
            return  # every handoff is reserved already
        running = self.queues.running
        for req in list(self.queues.waiting):
            if req.status is not _WAITING:
                continue
            if self.pool.occupancy > self.watermark:
                return
            busy = len(running) + self.num_in_flight_sequences
            if busy and busy + req.sampling.n > self.max_batch_size:
                return
            reservation = self._reserve(req)
            if reservation is None:
                return  # the pool cannot hold it yet: it waits, and so do those behind it
            plan.reservations.append(reservation)

    def _reserve(self, req: Request) -> KVReservation | None:
        handoff = self._handoff_of[req.request_id]
        pool, rid = self.pool, req.request_id
        prompt = req.num_prompt_tokens
        full = prompt // pool.page_size
        keys: list[PageKey] = self.prefix.prompt_keys(req) if self.prefix.enabled else []
        num_cached = len(pool.allocate_cached(rid, keys))
        # Room for the prompt and the first token (written by the first decode) for sequence
        # 0, and one private page for each fork (the rest of the prompt is shared).
        need = pool.pages_for(prompt + 1) - num_cached + req.sampling.n - 1
        if need > pool.num_free_pages:
            pool.free(rid)  # cached pages go back to the LRU, untouched
            return None
        pool.extend(rid, prompt + 1)
        pages = pool.pages_of(rid)
        forks = []
        for j in range(1, req.sampling.n):
            fork = Request(
                sequence_id(rid, j),
                req.prompt_token_ids,
                req.sampling.for_sequence(j),
                index=j,
                stream_id=rid,
            )
            pool.share(fork.request_id, pages[:full])
            pool.extend(fork.request_id, prompt + 1)
            forks.append(fork)
        self._forks[rid] = forks
        req.page_ids = pages
        req.status = _WAITING_FOR_KV
        self.in_flight[rid] = req
        indices = tuple(range(num_cached, handoff.num_pages))
        self.num_reserved += 1
        self.num_transferred_pages += len(indices)
        self.num_cached_pages += num_cached
        return KVReservation(
            handoff=handoff, page_indices=indices, target_page_ids=tuple(pages[i] for i in indices)
        )

    def end_transfer(self, end: TransferEnd) -> None:
        """A transfer into reserved pages ended: arrived or failed (a prefill rank's release
        is refused by the engine core before it gets here)."""
        if isinstance(end, KVArrived):
            self.arrived(end.request_id)
        elif isinstance(end, KVFailed):
            self.failed(end.request_id, end.error)

    def arrived(self, request_id: str) -> None:
        """The reserved pages of ``request_id`` hold its prompt's K/V: its sequences decode
        from the next plan on, and their first tokens go out with the next update."""
        req = self.in_flight.pop(request_id, None)
        if req is None:
            return  # not in flight (an unknown id, or reported twice)
        handoff = self._handoff_of.pop(request_id)
        forks = self._forks.pop(request_id)
        if request_id in self._orphans:
            self._orphans.discard(request_id)
            self._free(req, forks)
            return
        self.queues.waiting.remove(req)
        prompt = req.num_prompt_tokens
        page_size = self.pool.page_size
        if self.prefix.enabled:  # the arrived full pages are reusable here from now on
            keys = self.prefix.prompt_keys(req)
            for i, key in enumerate(keys):
                self.pool.register(req.page_ids[i], key)
        tail = prompt // page_size
        sequences = [req, *forks]
        finished_at_first = []
        for j, seq in enumerate(sequences):
            seq.num_computed_tokens = prompt
            seq.status = _DECODING
            if seq is not req:
                seq.page_ids = self.pool.pages_of(seq.request_id)
                self.queues.requests[seq.request_id] = seq
            lp = handoff.first_logprobs[j]
            if lp is not None:
                seq.output_logprobs.append(lp)
            self.queues.running.append(seq)
            token = handoff.first_token_ids[j]
            finished = seq.append_token(token, self.max_sequence_len)
            finished_at_first.append(finished)
            # Out with the next update, with the round's other ends (``RequestEnds.events``).
            self.ends.events.append(TokenEvent(seq, token, finished))
        # A fork that goes on decoding needs its own copy of the prompt's partial last page
        # (a fork that ended at its first token needs none: its pages are freed below). When
        # sequence 0 itself ended, its last page is held until the copies have read it.
        copies = [
            (req.page_ids[tail], seq.page_ids[tail])
            for seq, finished in zip(forks, finished_at_first[1:], strict=True)
            if not finished and prompt % page_size
        ]
        if copies and finished_at_first[0]:
            owner = f"{request_id}:fork-copy-source"
            self.pool.share(owner, [req.page_ids[tail]])
            self._copy_holds.append(owner)
        self._copies.extend(copies)
        for seq, finished in zip(sequences, finished_at_first, strict=True):
            if finished:
                self.retire(seq)

    def failed(self, request_id: str, error: str) -> None:
        """The transfer of ``request_id`` failed or timed out: it fails alone, its pages
        freed, with ``error`` for its client."""
        req = self.in_flight.pop(request_id, None)
        if req is None:
            return
        forks = self._forks.pop(request_id)
        for fork in forks:
            self.pool.free(fork.request_id)
        if request_id in self._orphans:
            self._orphans.discard(request_id)
            self._handoff_of.pop(request_id, None)
            self.pool.free(request_id)
            return
        self.ends.fail(req, error)

    def free_pages(self, req: Request) -> None:
        """``req`` ended (abort or failure): free its pages, or leave them to the transfer
        that is still writing them (freed when it ends)."""
        rid = req.request_id
        if rid in self.in_flight:
            self._orphans.add(rid)
            return
        self._handoff_of.pop(rid, None)
        self.pool.free(rid)

    def _free(self, req: Request, forks: list[Request]) -> None:
        for seq in (req, *forks):
            self.pool.free(seq.request_id)

    # ---- the sending end: nothing leaves a decode rank -----------------------------------

    def hand_off(
        self, req: Request, forks: tuple[int, ...], logprobs: dict[str, TokenLogprobs]
    ) -> Handoff:
        raise ValueError(f"request {req.request_id!r}: a decode rank hands nothing off")

    def take_handoffs(self) -> list[Handoff]:
        return []

    def is_pinned(self, request_id: str) -> bool:
        return False  # nothing leaves: the ids it holds are in the scheduler's requests
