"""The ingress's P/D path for one rank request: a prefill rank, then a decode rank.

The prefill role's router picks the rank with the fewest uncached prompt tokens (within its
load limits); its ``Handoff`` goes to the decode role, whose router picks the least-loaded
rank (on the ingress's guess and Serve's counts, or under ``router: kv-aware`` on what the
ranks report: ``roundgate.deployment.pd_config``); the decode rank receives the KV and streams the
tokens (its first item reports the transfer, recorded here). The result reads like a fused rank's
``generate`` stream, so the OpenAI surface above it is the same, resumption included
(``roundgate.deployment.resume``): a role's rank that dies raises Ray's actor error through this
stream, and a transfer whose prefill process died raises ``PrefillRankLost``; both read as a lost
rank, so the request is prefilled again (a continuation when tokens were streamed) on live ranks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from roundgate.actors.control.handoff import Handoff
from roundgate.actors.control.messages import GenerateChunk, GenerateRequest
from roundgate.actors.replica.pd_messages import DecodeRequest, ReleaseHandoff, TransferReport
from roundgate.deployment.request_metrics import RequestRecorder

if TYPE_CHECKING:  # Ray is not imported for a type (the ingress is tested without it)
    from ray.serve.handle import DeploymentHandle


class PrefillRankLost(RuntimeError):
    """The prefill process that held a request's KV is gone (its rank restarted): a lost rank
    for ``roundgate.deployment.resume`` (its ``RANK_LOSS`` names this class)."""


class PDStream:
    """One request's chunks over both roles; ``cancel`` lets go of whatever it holds (the
    decode stream, or a handoff whose pages no decode rank took yet)."""

    def __init__(self, route: PDRoute, message: GenerateRequest) -> None:
        self.route = route
        self.message = message
        self.handoff: Handoff | None = None
        self.report: TransferReport | None = None
        self._decode: Any = None

    def __aiter__(self) -> AsyncIterator[GenerateChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[GenerateChunk]:
        route = self.route
        result = await route.prefill.prefill.remote(self.message)
        for chunk in result.chunks:  # the whole answer when it ended at its first token
            yield chunk
        if result.handoff is None:
            return
        self.handoff = result.handoff
        request = DecodeRequest(
            handoff=result.handoff, source_incarnation=result.source_incarnation
        )
        self._decode = route.decode.decode.remote(request)
        async for item in self._decode:
            if isinstance(item, TransferReport):
                self.report = item
                route.metrics.pd_transfer(item.decode_wait_s, item.transfer_s)
                if item.source_lost:
                    raise PrefillRankLost(item.error)
                continue
            yield item

    def cancel(self) -> None:
        if self._decode is not None:
            self._decode.cancel()
        handoff = self.handoff
        if handoff is not None and self.report is None:
            # No decode rank asked for its pages (refused, or the client left first).
            release = ReleaseHandoff(request_id=handoff.request_id, dp_rank=handoff.source_rank)
            self.route.prefill.release_handoff.remote(release)


class PDRoute:
    """Handles to both roles and the ingress's request metrics."""

    def __init__(
        self, prefill: DeploymentHandle, decode: DeploymentHandle, metrics: RequestRecorder
    ) -> None:
        self.prefill = prefill
        self.decode = decode.options(stream=True)
        self.metrics = metrics

    def stream(self, message: GenerateRequest) -> PDStream:
        return PDStream(self, message)
