"""The P/D KV link between two real processes over gloo: pages land where they were reserved,
bit for bit, in the GQA and the MLA latent layouts; a failure notice, a wrong page count or a
header the reservation does not allow (refused before anything is allocated) fails that
transfer alone and the next one on the same link still arrives."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch
from kv_link_peers import make_cache, run_peer

from roundgate.actors.replica.kv_link import OK, PageShape, pack_pages

STEPS = [
    {"send": [3, 1, 6], "dst_pages": [0, 5, 2]},  # a scatter into other page ids
    {"send": None, "dst_pages": [4]},  # the sender reports it cannot send
    {"send": [2], "dst_pages": [1, 4]},  # a short count: refused, payload drained
    # Headers alone, as a broken or hostile peer sends them: refused before allocating.
    {"header": [OK, 3], "dst_pages": [1, 4]},  # more pages than reserved
    {"header": [OK, -1], "dst_pages": [1]},  # a negative count
    {"header": [OK, 10**12], "dst_pages": [1]},  # ~10^14 bytes, were it allocated
    {"header": [7, 1], "dst_pages": [1]},  # an unknown status
    {"send": [7], "dst_pages": [3]},  # the link is still in step
]
FAILURES = [  # (step, what the receiver's error says)
    (1, "KV link: link rank 0 could not send the KV pages (tag {tag})"),
    (2, "KV link: link rank 0 sent 1 pages, 2 were reserved (tag {tag})"),
    (3, "KV link: refused link rank 0's header (status 0, 3 pages) for 2 reserved pages "
        "(tag {tag}): page count out of range"),
    (4, "KV link: refused link rank 0's header (status 0, -1 pages) for 1 reserved pages "
        "(tag {tag}): page count out of range"),
    (5, "KV link: refused link rank 0's header (status 0, 1000000000000 pages) for 1 "
        "reserved pages (tag {tag}): page count out of range"),
    (6, "KV link: refused link rank 0's header (status 7, 1 pages) for 1 reserved pages "
        "(tag {tag}): unknown status"),
]  # fmt: skip
LAYOUTS = [False, True]  # GQA K/V pages, then MLA latent pages, over one link


@pytest.fixture(scope="module")
def link_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """Both layouts' steps on a sender (link rank 0) and a receiver (link rank 1)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tmp_path_factory.mktemp('kv-link') / 'link-store'}"
    procs = [
        ctx.Process(target=run_peer, args=(rank, init, STEPS, out, LAYOUTS)) for rank in (0, 1)
    ]
    for proc in procs:
        proc.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    return results[0], results[1]


@pytest.mark.parametrize("latent", LAYOUTS, ids=["gqa", "mla-latent"])
def test_pages_land_where_reserved_and_failures_stay_local(
    link_results: tuple[Any, Any], latent: bool
) -> None:
    sent, received = (side[latent] for side in link_results)
    source = sent[-1]
    shape = PageShape.of(make_cache(latent))
    status, size, pages = received[0]
    assert status == "ok" and size == 3 * shape.bytes_per_page == sent[0]
    for got, src in zip(pages, [3, 1, 6], strict=True):
        assert got == source[src]
    first_tag = 1 + len(STEPS) * LAYOUTS.index(latent)  # one tag per step, layouts in turn
    for step, message in FAILURES:
        assert received[step] == ("failed", message.format(tag=first_tag + step))
    status, size, pages = received[-1]
    assert status == "ok" and pages[0] == source[7]


def test_pack_pages_matches_the_cache_layout() -> None:
    cache = make_cache(latent=False, fill=True)
    packed = pack_pages(cache, [4, 2])
    assert packed.shape == PageShape.of(cache).payload(2)
    assert torch.equal(packed, cache.read_pages([4, 2]))
