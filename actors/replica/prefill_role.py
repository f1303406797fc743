"""The prefill role: a rank that computes a prompt's KV and first token, then hands the request off.

``prefill`` runs the request like ``generate`` until the round that samples its first token
turns it into a ``Handoff`` (its pages pinned here); ``send_kv``, called by the decode rank
that reserved pages for it, sends those pages over that pair of the P/D link
(``roundgate.actors.replica.pd_pairs``) and unpins them, whatever happened. A request that ends at
its first token (or is refused) comes back whole instead. A handoff no decode rank asks for
within ``--handoff-timeout-s`` (its ingress died holding it) is released here on its own
(``roundgate.actors.control.handoff_expiry``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from roundgate.actors.control.handoff import Handoff
from roundgate.actors.control.handoff_expiry import HandoffExpiry
from roundgate.actors.control.messages import GenerateChunk, GenerateRequest, RankTarget
from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.replica import pd_pairs
from roundgate.actors.replica.intake import PromptIntake
from roundgate.actors.replica.kv_link import TransferFailed
from roundgate.actors.replica.pd_messages import LinkSpec, PrefillResult, ReleaseHandoff, SendKV
from roundgate.actors.replica.rank_engine import RankEngine
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.telemetry.transfer_metrics import TransferMetrics

logger = logging.getLogger("roundgate.prefill")


class PrefillRole:
    """``RankRole`` of a prefill rank: prefill only, then the KV goes to a decode rank."""

    name = DisaggregationRole.PREFILL

    def __init__(
        self,
        engine: RankEngine,
        intake: PromptIntake,
        wake: Callable[[], None],
        transfers: TransferMetrics,
        link: LinkSpec,
    ) -> None:
        self.engine = engine
        self.intake = intake
        self.wake = wake  # the membership's: a released handoff may let the group run
        self.transfers = transfers
        self.link_spec = link
        self.link: pd_pairs.LinkPairs | None = None  # joined at ``start``
        # Fault injection for tests and drills: the next sends report a failure instead.
        self.num_faults = 0
        # Pinned handoffs' deadlines: written by the engine thread (``after_round``) and the
        # event loop (transfers ending, the expiry task), hence the lock.
        self.expiry = HandoffExpiry(engine.args.handoff_timeout_s)
        self.clock: Callable[[], float] = time.monotonic
        self._expiry_lock = threading.Lock()
        self._expiry_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Join the P/D link (its decode ranks are awaited once)."""
        args, rank = self.engine.args, self.engine.membership.rank
        self.link = await asyncio.to_thread(
            pd_pairs.join,
            self.link_spec,
            DisaggregationRole.PREFILL,
            rank,
            args.device,
            args.collective_timeout_s,
        )
        logger.info(
            "prefill rank %d (process %s) joined P/D link %s",
            rank,
            self.link.incarnation,
            self.link_spec.link_id,
        )
        self._expiry_task = asyncio.get_running_loop().create_task(self._expire_orphans())

    def after_round(self, outcome: RoundOutcome) -> None:
        core = self.engine.core
        now = self.clock()
        for handoff in outcome.handoffs:
            # Its deadline first: once delivered, a decode rank may claim it at once.
            with self._expiry_lock:
                self.expiry.pinned(handoff.request_id, now)
            if not self.engine.deliver(handoff.request_id, handoff):
                # Its caller went away: nobody will send these pages.
                self._claim(handoff.request_id)
                core.release_handoff(handoff.request_id)
        self.transfers.set_waiting(core.connector.num_waiting_for_decode)

    def expire(self, now: float) -> list[str]:
        """Release the handoffs pinned past ``--handoff-timeout-s`` at ``now`` (those no
        transfer ended meanwhile); their ids."""
        with self._expiry_lock:
            expired = self.expiry.expired(now)
        if not expired:
            return []
        for request_id in expired:
            logger.warning(
                "handoff %s: no decode rank asked for its pages in %.0f s "
                "(--handoff-timeout-s); released",
                request_id,
                self.expiry.timeout_s,
            )
            self.engine.core.release_handoff(request_id)
        self.transfers.expired(len(expired))
        self.wake()
        return expired

    async def _expire_orphans(self) -> None:
        """Check the deadlines a few times per timeout (at most once a second); rounds are
        no clock for this, as a group with nothing else to do runs none."""
        period = min(1.0, self.expiry.timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            try:
                self.expire(self.clock())
            except Exception:  # never let the task die quietly: the next tick tries again
                logger.exception("releasing expired handoffs failed")

    def _claim(self, request_id: str) -> bool:
        """Take ``request_id`` off the expiry clock; False when it expired already (its
        release is queued: its pages must not be read)."""
        with self._expiry_lock:
            return self.expiry.ended(request_id)

    async def prefill(self, message: GenerateRequest) -> PrefillResult:
        """Prefill ``message``; its ``Handoff``, or its whole answer when it needs no decode."""
        start = time.monotonic()
        chunks: list[GenerateChunk] = []
        async for item in self.intake.stream(message.to_request(), until=Handoff):
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
        core = self.engine.core
        # Claimed before the pages are read, so the expiry cannot release them mid-send.
        ok = self._claim(order.request_id) and core.connector.is_pinned(order.request_id)
        if ok and self.num_faults > 0:
            self.num_faults -= 1
            ok = False
            logger.warning("injected KV transfer fault for request %s", order.request_id)
        cache = self.engine.runner.cache if ok else None
        start = time.monotonic()
        try:
            size = await asyncio.to_thread(self._send, order, cache)
        except TransferFailed:
            self.transfers.failed()
            raise
        finally:
            core.release_handoff(order.request_id)
            self.wake()
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
        self._claim(order.request_id)
        self.engine.core.release_handoff(order.request_id)
        self.wake()

    async def inject_transfer_faults(self, target: RankTarget, count: int) -> None:
        """Make the next ``count`` sends report a failure (tests and failure drills)."""
        self.num_faults = count
