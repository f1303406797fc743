"""Link members for ``test_pd_pairs``, each in its own process: a decode rank and prefill
ranks (one process per incarnation), steered by the test through queues.

Each takes orders until it gets None; every answer goes to the shared ``out`` queue tagged
with the member's name, so the test reads what happened in order. The presence store is the
test's TCP store (``TorchStore`` over a client); a prefill process fills its cache with values
that name its ``fill`` (one per incarnation), its layer and page.
"""

from __future__ import annotations

import os
from typing import Any

from kv_link_peers import make_cache

from roundgate.actors.replica.kv_link import TransferFailed
from roundgate.actors.replica.membership import TorchStore
from roundgate.actors.replica.pd_messages import LinkSpec
from roundgate.actors.replica.pd_pairs import DECODE_END, PREFILL_END, LinkPairs, SourceLost
from roundgate.actors.role import DisaggregationRole

SPEC = LinkSpec(link_id="pairs-test", num_prefill=1, num_decode=1)


def _store(port: int) -> TorchStore:
    from datetime import timedelta

    import torch.distributed as dist

    return TorchStore(dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30)))


def run_prefill(name: str, port: int, host: str | None, fill: int, out: Any, inbox: Any) -> None:
    """Publish, then for each ``(decode_incarnation, pages, tag)`` send those pages."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    pairs = LinkPairs(SPEC, DisaggregationRole.PREFILL, 0, _store(port), host=host, timeout_s=10)
    cache = make_cache(False, fill=True)
    for part in [cache.k, cache.v]:
        for tensor in part:
            tensor.add_(10_000 * fill)
    out.put((name, "up", pairs.incarnation))
    for incarnation, pages, tag in iter(inbox.get, None):
        try:
            pairs.pair_with(0, incarnation).send(cache, pages, DECODE_END, tag)
            out.put((name, "sent", pairs.num_pairs))
        except TransferFailed as exc:
            out.put((name, "failed", str(exc)))


def run_decode(name: str, port: int, timeout_s: float, out: Any, inbox: Any) -> None:
    """Wait for the prefill role, then for each ``(prefill_incarnation, pages, tag)``
    receive that many pages into ``pages`` and report what landed (or why not)."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    pairs = LinkPairs(SPEC, DisaggregationRole.DECODE, 0, _store(port), timeout_s=timeout_s)
    pairs.wait_for_peers()
    out.put((name, "up", pairs.incarnation))
    cache = make_cache(False)
    for incarnation, pages, tag in iter(inbox.get, None):
        try:
            pairs.current(0, incarnation)
            pairs.pair_with(0, incarnation).receive(cache, pages, PREFILL_END, tag)
            landed = [round(cache.read_pages([p])[0, 0, 0, 0, 0, 0].item()) for p in pages]
            out.put((name, "ok", landed))
        except SourceLost as exc:
            out.put((name, "lost", str(exc)))
        except TransferFailed as exc:
            out.put((name, "failed", str(exc)))
