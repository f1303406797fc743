"""The two ends of a real KV link, each in its own process (spawned by ``test_kv_link``).

The sender fills a paged cache with values that name their (part, layer, page, slot), sends
the scenario's pages and reports nothing; the receiver receives into its own pages and
returns what landed where, so the test compares the two caches page by page. Pages travel
back to the test as lists (a tensor's shared memory would die with its process).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from roundgate.actors.replica.kv_link import KVLink, TransferFailed, open_store
from roundgate.kernels.attention.batch import PagedKVCache


def make_cache(latent: bool, num_pages: int = 8, fill: bool = False) -> PagedKVCache:
    """A small cache (2 layers, page size 4); ``fill``: every element encodes its place."""
    if latent:
        cache = PagedKVCache.allocate_latent(2, num_pages, 4, 6, torch.float32, torch.device("cpu"))
    else:
        cache = PagedKVCache.allocate(2, num_pages, 4, 2, 3, torch.float32, torch.device("cpu"))
    if fill:
        parts = [cache.k, cache.v] if cache.v else [cache.k]
        for p, part in enumerate(parts):
            for layer, tensor in enumerate(part):
                pages = torch.arange(num_pages, dtype=torch.float32).view(-1, 1, 1, 1)
                tensor.copy_(1000 * p + 100 * layer + pages + 0.01 * torch.rand_like(tensor))
    return cache


def run_peer(
    link_rank: int, init_method: str, steps: list[dict[str, Any]], out: Any, layouts: list[bool]
) -> None:
    """For each cache layout (``latent`` or not), run ``steps`` in order over one link: each is
    ``{"send": [...], "dst_pages": [...]}`` seen from both ends (rank 0 sends, rank 1
    receives); ``send: None`` sends a failure notice; ``{"header": [status, num_pages]}``
    instead of ``send`` sends that header alone, as a broken or hostile peer would."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    store = open_store(init_method, 2, 20)
    link = KVLink(store, link_rank, 2, "gloo", timeout_s=20)
    tags = iter(range(1, 10_000))
    by_layout: dict[bool, list[Any]] = {}
    for latent in layouts:
        cache = make_cache(latent, fill=link_rank == 0)
        results = by_layout[latent] = []
        for step in steps:
            tag = next(tags)
            if link_rank == 0 and "header" in step:
                header = torch.tensor(step["header"], dtype=torch.int64)
                link.group.send([header], 1, tag).wait()
                results.append(0)
                continue
            if link_rank == 0:
                pages = step["send"]
                results.append(link.send(None if pages is None else cache, pages or [], 1, tag))
                continue
            try:
                size = link.receive(cache, step["dst_pages"], 0, tag)
                results.append(
                    ("ok", size, [cache.read_pages([p]).tolist() for p in step["dst_pages"]])
                )
            except TransferFailed as exc:
                results.append(("failed", str(exc)))
        if link_rank == 0:
            results.append([cache.read_pages([p]).tolist() for p in range(cache.num_pages)])
    out.put((link_rank, by_layout))
