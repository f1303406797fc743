"""One pair of the P/D link: a two-member torch.distributed group that moves KV pages.

A prefill rank hands a request's KV pages to a decode rank point to point over a group of
the two (gloo on CPU, NCCL on GPU): no pickling, no Serve handle in the data path, and no
pages in Ray's object store. The group is a process group object of its own, apart from the DP
group each rank already joined, so a transfer never queues behind a round's collectives and
both can run at once on different threads. Which pairs exist, and how they meet, is
``roundgate.actors.replica.pd_pairs``'s (a pair per prefill and decode process, formed on first
use).

One transfer is two messages with the same tag: a header (``[status, num_pages]``, int64)
and, when the status is ``OK``, the pages ``[parts, layers, pages, page_size, heads, dim]``
(parts: K and V, or MLA's latent alone) in the pool's own layout and dtype. A sender that
cannot send (its pages are gone, an injected fault) sends the header alone with ``FAILED``,
so the receiver learns it at once instead of waiting out the timeout, and the pair stays in
step for the next transfer.

The receiver trusts a header no further than its own reservation: an unknown status, a
negative count or more pages than it reserved fails that transfer before anything is
allocated (a peer's header never sizes a buffer beyond what the request reserved), and the
rank goes on with its other transfers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from roundgate.kernels.attention.batch import PagedKVCache

OK, FAILED = 0, 1


class TransferFailed(RuntimeError):
    """One request's KV transfer did not complete; the link and other requests are fine."""


@dataclass(frozen=True, slots=True)
class PageShape:
    """The layout of one transfer's payload, identical on both ends (checked at startup)."""

    num_parts: int
    num_layers: int
    page_size: int
    num_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, cache: PagedKVCache) -> PageShape:
        parts = 2 if cache.v else 1
        _, page_size, heads, dim = cache.k[0].shape
        return cls(parts, len(cache.k), page_size, heads, dim, cache.k[0].dtype)

    def payload(self, num_pages: int) -> tuple[int, ...]:
        return (self.num_parts, self.num_layers, num_pages, self.page_size, self.num_heads,
                self.head_dim)  # fmt: skip

    @property
    def bytes_per_page(self) -> int:
        per = self.num_parts * self.num_layers * self.page_size * self.num_heads * self.head_dim
        return per * torch.empty((), dtype=self.dtype).element_size()


def pack_pages(cache: PagedKVCache, page_ids: Sequence[int]) -> torch.Tensor:
    """``page_ids`` of every layer as one contiguous tensor on the cache's device."""
    device = cache.k[0].device
    index = torch.tensor(list(page_ids), dtype=torch.long, device=device)
    parts = [cache.k, cache.v] if cache.v else [cache.k]
    return torch.stack([torch.stack([t.index_select(0, index) for t in part]) for part in parts])


class KVLink:
    """This rank's end of the P/D link: send pages to a peer, or receive them into pages."""

    def __init__(
        self,
        store: dist.Store,
        link_rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        *,
        name: str = "KV link",
    ) -> None:
        self.link_rank, self.world_size, self.name = link_rank, world_size, name
        self.timeout = timedelta(seconds=timeout_s)
        if backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = self.timeout
            iface = os.environ.get("GLOO_SOCKET_IFNAME")
            device = (
                dist.ProcessGroupGloo.create_device(interface=iface)
                if iface
                else dist.ProcessGroupGloo.create_default_device()
            )
            options._devices = [device]
            self.group: dist.ProcessGroup = dist.ProcessGroupGloo(
                store, link_rank, world_size, options
            )
            self.device = torch.device("cpu")
        elif backend == "nccl":
            self.group = dist.ProcessGroupNCCL(store, link_rank, world_size)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"KV link backend must be gloo or nccl, got {backend!r}")

    def send(self, cache: PagedKVCache | None, page_ids: Sequence[int], dst: int, tag: int) -> int:
        """Send ``page_ids`` of ``cache`` to link rank ``dst`` (``cache`` None: a failure
        notice); returns the payload's bytes. Blocks until the receiver took it."""
        if cache is None:
            self._wait(self.group.send([self._header(FAILED, 0)], dst, tag), "send", dst, tag)
            return 0
        payload = pack_pages(cache, page_ids).contiguous()
        self._wait(self.group.send([self._header(OK, len(page_ids))], dst, tag), "send", dst, tag)
        self._wait(self.group.send([payload], dst, tag), "send", dst, tag)
        return payload.numel() * payload.element_size()

    def receive(self, cache: PagedKVCache, page_ids: Sequence[int], src: int, tag: int) -> int:
        """Receive ``len(page_ids)`` pages from link rank ``src`` into ``page_ids`` of
        ``cache``; returns the bytes. ``TransferFailed`` when the sender reports a failure,
        sends a header its reservation does not allow, another page count, or nothing arrives
        within the link's timeout."""
        header = self._header(0, 0)
        self._wait(self.group.recv([header], src, tag), "receive", src, tag)
        status, count = (int(x) for x in header.tolist())
        reserved = len(page_ids)
        if status == FAILED:
            raise TransferFailed(
                f"{self.name}: link rank {src} could not send the KV pages (tag {tag})"
            )
        if status != OK or not 0 <= count <= reserved:
            # Refused before allocating: the payload (if the peer sends one) is left
            # unreceived, and only that sender's transfer waits out its timeout.
            raise TransferFailed(
                f"{self.name}: refused link rank {src}'s header (status {status}, {count} "
                f"pages) for {reserved} reserved pages (tag {tag}): "
                + ("unknown status" if status != OK else "page count out of range")
            )
        shape = PageShape.of(cache)
        payload = torch.empty(shape.payload(count), dtype=shape.dtype, device=self.device)
        # Taken even when the count is short: a payload left unreceived would hold the
        # sender until its timeout (its size is within the reservation).
        self._wait(self.group.recv([payload], src, tag), "receive", src, tag)
        if count != reserved:
            raise TransferFailed(
                f"{self.name}: link rank {src} sent {count} pages, {reserved} were reserved "
                f"(tag {tag})"
            )
        cache.write_pages(page_ids, payload)
        return payload.numel() * payload.element_size()

    def _header(self, status: int, num_pages: int) -> torch.Tensor:
        return torch.tensor([status, num_pages], dtype=torch.int64, device=self.device)

    def _wait(self, work: dist.Work, verb: str, peer: int, tag: int) -> None:
        try:
            work.wait(self.timeout)
        except Exception as exc:  # gloo raises RuntimeError on a timeout or a closed peer
            raise TransferFailed(
                f"{self.name}: KV {verb} with link rank {peer} (tag {tag}) failed: {exc}"
            ) from exc


def open_store(init_method: str, world_size: int, timeout_s: float) -> dist.Store:
    """A link's store for tests and benchmarks on one host: a file (``file://``). Served
    pairs meet in the prefill process's guarded store (``pd_pairs``)."""
    if not init_method.startswith("file://"):
        raise ValueError(f"open_store takes a file:// init method, got {init_method!r}")
    store = dist.FileStore(init_method[len("file://") :], world_size)
    store.set_timeout(timedelta(seconds=timeout_s))
    return store
