"""Offline prefill/decode disaggregation: a prefill rank and a decode rank in one process.

``DisaggregatedEngine(prefill_args, decode_args).run(requests)`` drives two ``EngineCore``s
round by round and moves each handoff's KV the way a transport would, in the pools' own
layout (``PagedKVCache.read_pages`` / ``write_pages``: K and V pages, or MLA's latent pages),
only the pages the decode rank's reservation names. No Ray: it is the reference the served
P/D path is held to, and the place the control plane's handoff protocol is exercised on a
real model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.handoff import KVReservation
from roundgate.actors.control.request import Request
from roundgate.actors.control.round import RoundPlan, TokenEvent
from roundgate.actors.pd_roles import check_pair
from roundgate.actors.server_args import ServerArgs


@dataclass
class TransferStats:
    """What moved between the roles."""

    num_transfers: int = 0
    num_pages: int = 0  # pages copied
    num_cached_pages: int = 0  # pages the decode rank already had (not copied)
    num_bytes: int = 0
    num_failed: int = 0


@dataclass
class PDRecords:
    """Each role's round plans (the shape the tests read), and every sequence's request."""

    prefill_plans: list[RoundPlan] = field(default_factory=list)
    decode_plans: list[RoundPlan] = field(default_factory=list)
    # Every request that produced an event on either rank, by id (forks included).
    requests: dict[str, Request] = field(default_factory=dict)


class DisaggregatedEngine:
    """One prefill rank and one decode rank over their model runners, in one thread.

    ``fail_transfer(reservation)``: a test's hook; when it returns True, that transfer is
    reported failed instead of copied (the decode rank fails the request alone).
    """

    def __init__(
        self,
        prefill_args: ServerArgs,
        decode_args: ServerArgs,
        fail_transfer: Callable[[KVReservation], bool] | None = None,
    ) -> None:
        from roundgate.actors.model.runner import ModelRunner

        check_pair(prefill_args, decode_args)
        self.prefill_runner = ModelRunner(prefill_args)
        self.decode_runner = ModelRunner(decode_args)
        self.prefill = EngineCore(self.prefill_runner.args, self.prefill_runner)
        self.decode = EngineCore(self.decode_runner.args, self.decode_runner)
        self.fail_transfer = fail_transfer
        self.stats = TransferStats()
        self.records = PDRecords()

    def transfer(self, reservation: KVReservation) -> None:
        """Copy the reserved pages from the prefill cache into the decode cache."""
        sources = reservation.source_page_ids
        if sources:
            saved = self.prefill_runner.cache.read_pages(sources)
            self.decode_runner.cache.write_pages(reservation.target_page_ids, saved)
            self.stats.num_bytes += saved.numel() * saved.element_size()
        self.stats.num_transfers += 1
        self.stats.num_pages += len(sources)
        self.stats.num_cached_pages += reservation.num_cached_pages

    def _keep(self, events: Sequence[TokenEvent]) -> None:
        for event in events:
            self.records.requests[event.request.request_id] = event.request

    def step(self) -> None:
        """One round of each rank, handing off and transferring in between."""
        out = self.prefill.step()
        self.records.prefill_plans.append(out.plan)
        self._keep(out.events)
        for handoff in out.handoffs:
            try:
                self.decode.submit_handoff(handoff)
            except ValueError as exc:  # refused at the decode rank's intake: fails alone
                handoff_req = handoff.to_request()
                handoff_req.error = str(exc)
                self.records.requests[handoff.request_id] = handoff_req
                self.prefill.release_handoff(handoff.request_id)
        out = self.decode.step()
        self.records.decode_plans.append(out.plan)
        self._keep(out.events)
        for reservation in out.plan.reservations:
            rid = reservation.request_id
            if self.fail_transfer is not None and self.fail_transfer(reservation):
                self.stats.num_failed += 1
                self.decode.kv_failed(rid, f"KV transfer of request {rid} failed")
            else:
                self.transfer(reservation)
                self.decode.kv_arrived(rid)
            self.prefill.release_handoff(rid)

    def run(self, requests: Sequence[Request], max_rounds: int = 100_000) -> dict[str, Request]:
        """Run ``requests`` to their end; every sequence's final request by id (a request
        that went to the decode rank is a new object there, with its whole output)."""
        for req in requests:
            self.prefill.submit(req)
        for _ in range(max_rounds):
            if not (self.prefill.has_local_work or self.decode.has_local_work):
                return self.records.requests
            self.step()
        raise RuntimeError(f"P/D run did not finish within {max_rounds} rounds")
