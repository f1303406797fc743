"""A prefill-role rank: computes a prompt's KV and first token, then hands the request off.

``prefill`` runs the request like ``generate`` until the round that samples its first token
turns it into a ``Handoff`` (its pages pinned here); ``send_kv``, called by the decode rank
that reserved pages for it, sends those pages over that pair of the P/D link
(``roundgate.actors.replica.pd_pairs``) and unpins them, whatever happened. A request that ends at
its first token (or is refused) comes back whole instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from roundgate.actors.control.handoff import Handoff
from roundgate.actors.control.messages import GenerateChunk, GenerateRequest, RankTarget
from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.replica import pd_pairs
from roundgate.actors.replica.kv_link import TransferFailed
from roundgate.actors.replica.pd_messages import LinkSpec, PrefillResult, ReleaseHandoff, SendKV
from roundgate.actors.replica.rank_replica import RankReplica
from roundgate.actors.server_args import DisaggregationRole
from roundgate.actors.telemetry.transfer_metrics import TransferMetrics

logger = logging.getLogger("roundgate.prefill")


class PrefillRankReplica(RankReplica):
    """One rank of the prefill group: prefill only, then the KV goes to a decode rank."""

    async def __init__(self, args: dict[str, Any], link: LinkSpec) -> None:
        await super().__init__(args)
        if self.args.disaggregation_mode is not DisaggregationRole.PREFILL:
            raise ValueError("PrefillRankReplica needs --disaggregation-mode prefill")
        self.transfers = TransferMetrics(
            self.metrics.set,
            self.gang_id,
            self.metrics_model,
            self.rank,
            DisaggregationRole.PREFILL,
        )
        # Fault injection for tests and drills: the next sends report a failure instead.
        self._faults = 0
        self.link = await asyncio.to_thread(
            pd_pairs.join,
            link,
            DisaggregationRole.PREFILL,
            self.rank,
            self.args.device,
            self.args.collective_timeout_s,
        )
        logger.info(
            "prefill rank %d (process %s) joined P/D link %s",
            self.rank,
            self.link.incarnation,
            link.link_id,
        )

    def _after_round(self, outcome: RoundOutcome) -> None:
        for handoff in outcome.handoffs:
            queue = self._streams.get(handoff.request_id)
            if queue is None:  # its caller went away: nobody will send these pages
                self.core.release_handoff(handoff.request_id)
            else:
                self._outbox.put(queue, handoff)
        self.transfers.set_waiting(self.core.connector.num_waiting_for_decode)

    async def generate(self, message: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """A prefill rank never decodes: its requests come through ``prefill``."""
        raise ValueError("a prefill rank takes requests through prefill(), not generate()")
        yield  # an async generator, as Serve's streaming call expects

    async def prefill(self, message: GenerateRequest) -> PrefillResult:
        """Prefill ``message``; its ``Handoff``, or its whole answer when it needs no decode."""
        start = time.monotonic()
        chunks: list[GenerateChunk] = []
        async for item in self._generate(message.to_request(), until=Handoff):
            if isinstance(item, Handoff):
                return PrefillResult(
                    handoff=item,
                    chunks=tuple(chunks),
                    prefill_s=time.monotonic() - start,
                    source_incarnation=self.link.incarnation,
                )
            chunks.append(item)
        return PrefillResult(handoff=None, chunks=tuple(chunks), prefill_s=time.monotonic() - start)

    async def send_kv(self, order: SendKV) -> int:
        """Send a handoff's pages to the decode rank that reserved room for them, then unpin
        them; returns the bytes sent. A handoff that is no longer pinned here (released, or
        never made) is reported to the receiver as a failure, so it fails that request at
        once instead of waiting out the link's timeout. An order for an earlier process of
        this rank finds nothing here and no peer waiting (the decode rank saw the restart in
        the link's records): it is dropped."""
        if order.source_incarnation != self.link.incarnation:
            logger.info("send_kv for %s: made by an earlier process of this rank", order.request_id)
            return 0
        ok = self.core.connector.is_pinned(order.request_id)
        if ok and self._faults > 0:
            self._faults -= 1
            ok = False
            logger.warning("injected KV transfer fault for request %s", order.request_id)
        cache = self._runner.cache if ok else None
        start = time.monotonic()
        try:
            size = await asyncio.to_thread(self._send, order, cache)
        except TransferFailed:
            self.transfers.failed()
            raise
        finally:
            self.core.release_handoff(order.request_id)
            self._wake_group()
        if not ok:
            self.transfers.failed()
            return 0
        self.transfers.transferred(len(order.page_ids), size, time.monotonic() - start)
        return size

    def _send(self, order: SendKV, cache: Any) -> int:
        """Form (or reuse) the pair with the decode process, then send (a worker thread)."""
        pair = self.link.pair_with(order.dst_rank, order.dst_incarnation)
        return pair.send(cache, order.page_ids, pd_pairs.DECODE_END, order.tag)

    async def release_handoff(self, order: ReleaseHandoff) -> None:
        """Unpin a handoff no decode rank will take (idempotent)."""
        self.core.release_handoff(order.request_id)
        self._wake_group()

    async def inject_transfer_faults(self, target: RankTarget, count: int) -> None:
        """Make the next ``count`` sends report a failure (tests and failure drills)."""
        self._faults = count
