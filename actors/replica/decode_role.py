"""The decode role: a rank that takes a prefill rank's handoff, receives its KV, and only decodes.

``decode`` queues the handoff; a round reserves its pages (under the 0.9 watermark and the
batch's slots, like a new prompt on a fused rank: until then it waits for decode capacity);
the rank then asks the handoff's prefill rank to send (``send_kv``) while it receives into the
reserved pages over their pair of the P/D link (``roundgate.actors.replica.pd_pairs``), and reports
the KV arrived (the request decodes from the next round) or failed (that request alone ends
with a 500, its pages freed; or, when the prefill process that held the pages is gone, the
report says so and the ingress prefills the request again, as after any lost rank). The stream's
first item is a ``TransferReport``, then the request's chunks, as ``generate`` streams them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from roundgate.actors.control.handoff import KVReservation
from roundgate.actors.control.messages import GenerateChunk, Usage
from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.replica import pd_pairs
from roundgate.actors.replica.chunks import ChunkBuilder, relay
from roundgate.actors.replica.kv_link import TransferFailed
from roundgate.actors.replica.pd_messages import (
    DecodeRequest,
    LinkSpec,
    ReleaseHandoff,
    SendKV,
    TransferReport,
)
from roundgate.actors.replica.rank_engine import RankEngine
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.telemetry.transfer_metrics import TransferMetrics

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

logger = logging.getLogger("roundgate.decode")
MAX_TAG = 2**31 - 1


class DecodeRole:
    """``RankRole`` of a decode rank: an attention-DP rank whose requests arrive with KV."""

    name = DisaggregationRole.DECODE

    def __init__(
        self,
        engine: RankEngine,
        wake: Callable[[], None],
        transfers: TransferMetrics,
        link: LinkSpec,
        prefill: DeploymentHandle,
    ) -> None:
        self.engine = engine
        self.wake = wake  # the membership's: a handoff or a transfer's end lets it run
        self.transfers = transfers
        self.link_spec = link
        self.link: pd_pairs.LinkPairs | None = None  # joined at ``start``
        self.prefill_ranks = prefill  # the prefill role's deployment: send_kv, release
        # Tags of this rank's transfers: unique per (sender, this receiver) pair in flight.
        self.tags = itertools.count(1)
        self.pending_calls: set[asyncio.Future] = set()

    async def start(self) -> None:
        """Join the P/D link (its prefill ranks are awaited once)."""
        args, rank = self.engine.args, self.engine.membership.rank
        self.link = await asyncio.to_thread(
            pd_pairs.join,
            self.link_spec,
            DisaggregationRole.DECODE,
            rank,
            args.device,
            args.collective_timeout_s,
        )
        logger.info(
            "decode rank %d (process %s) joined P/D link %s",
            rank,
            self.link.incarnation,
            self.link_spec.link_id,
        )

    def after_round(self, outcome: RoundOutcome) -> None:
        core = self.engine.core
        for reservation in outcome.plan.reservations:
            if not self.engine.deliver(reservation.request_id, reservation):
                # Its caller went away: free the pages nobody will fill.
                core.kv_failed(reservation.request_id, "the request's caller went away")
        self.transfers.set_waiting(core.connector.num_waiting_for_decode)

    async def decode(self, message: DecodeRequest) -> AsyncIterator[GenerateChunk | TransferReport]:
        """Take the handoff, receive its KV, stream its tokens (first item: the report)."""
        engine = self.engine
        if engine.error is not None:
            raise engine.error
        core = engine.core
        handoff = message.handoff
        request_id = handoff.request_id
        usage = Usage(prompt_tokens=len(handoff.prompt_token_ids), completion_tokens=0)
        queue = engine.open_stream(request_id)
        if queue is None:
            error = f"request id {request_id!r} is already streaming on this rank"
            yield GenerateChunk(token_ids=(), finish_reason="error", usage=usage, error=error)
            return
        finished = False
        builder = ChunkBuilder(handoff.to_request(), engine.args.stream_interval)
        try:
            try:  # off the event loop: a grammar compiles here on first use
                await asyncio.to_thread(core.submit_handoff, handoff)
            except ValueError as exc:  # this request cannot run here; the group is fine
                finished = True
                yield GenerateChunk(
                    token_ids=(), finish_reason="error", usage=usage, error=str(exc)
                )
                return
            self.wake()
            arrived = time.monotonic()
            reservation = None
            async for item in relay(builder, queue, until=KVReservation):
                if isinstance(item, KVReservation):
                    reservation = item
                else:
                    yield item
            if reservation is None:  # it ended before any page was reserved
                finished = True
                return
            yield await self._receive(
                reservation, time.monotonic() - arrived, message.source_incarnation
            )
            async for chunk in relay(builder, queue):
                yield chunk
            finished = True
        finally:
            engine.close_stream(request_id)
            if not finished:
                for sequence in builder.unfinished_ids():
                    core.abort(sequence)

    async def _receive(
        self, reservation: KVReservation, waited: float, incarnation: str
    ) -> TransferReport:
        """Have the prefill rank (process ``incarnation``) send the reserved pages and receive
        them; the request's KV arrived or failed either way when this returns."""
        handoff = reservation.handoff
        request_id, source = handoff.request_id, handoff.source_rank
        sources = reservation.source_page_ids
        start = time.monotonic()
        if not sources:  # every page was prefix-cached here: nothing moves
            release = ReleaseHandoff(request_id=request_id, dp_rank=source)
            self._track(self.prefill_ranks.release_handoff.remote(release))
            self.engine.core.kv_arrived(request_id)
            self.wake()
            return TransferReport(decode_wait_s=waited, transfer_s=0.0, num_pages=0, num_bytes=0)
        tag = next(self.tags) % MAX_TAG + 1
        order = SendKV(
            request_id=request_id,
            page_ids=sources,
            dst_rank=self.engine.membership.rank,
            dst_incarnation=self.link.incarnation,
            tag=tag,
            dp_rank=source,
            source_incarnation=incarnation,
        )
        try:
            self.link.current(source, incarnation)  # its process still runs (else: lost)
            self._track(self.prefill_ranks.send_kv.remote(order))
            size = await asyncio.to_thread(
                self._take, source, incarnation, reservation.target_page_ids, tag
            )
        except TransferFailed as exc:
            self.transfers.failed()
            lost = isinstance(exc, pd_pairs.SourceLost) or not self._still_there(
                source, incarnation
            )
            error = f"KV transfer from prefill rank {source} failed: {exc}"
            self.engine.core.kv_failed(request_id, error)
            self.wake()
            return TransferReport(
                decode_wait_s=waited,
                transfer_s=time.monotonic() - start,
                num_pages=0,
                num_bytes=0,
                error=error,
                source_lost=lost,
            )
        self.engine.core.kv_arrived(request_id)
        self.wake()
        seconds = time.monotonic() - start
        self.transfers.transferred(len(sources), size, seconds)
        return TransferReport(
            decode_wait_s=waited, transfer_s=seconds, num_pages=len(sources), num_bytes=size
        )

    def _take(self, source: int, incarnation: str, pages: tuple[int, ...], tag: int) -> int:
        """Form (or reuse) the pair with the prefill process, then receive (a worker thread)."""
        pair = self.link.pair_with(source, incarnation)
        return pair.receive(self.engine.runner.cache, pages, pd_pairs.PREFILL_END, tag)

    def _still_there(self, source: int, incarnation: str) -> bool:
        """Whether prefill ``source``'s process ``incarnation`` is still the published one (a
        failed transfer from a process that has since restarted lost the pages with it)."""
        record = self.link.peer(source)
        return record is not None and record.incarnation == incarnation

    def _track(self, response: Any) -> None:
        """Await a call to the prefill role in the background; its failure is logged (the
        transfer's own outcome already decided the request's)."""

        async def wait() -> None:
            try:
                await response
            except Exception as exc:
                logger.warning("call to the prefill role failed: %r", exc)

        task = asyncio.ensure_future(wait())
        self.pending_calls.add(task)
        task.add_done_callback(self.pending_calls.discard)
