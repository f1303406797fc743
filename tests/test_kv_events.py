"""The KV-event channel's pure parts: the pool's notes, the batches, the router's index.

The property test drives a real ``KVPool`` through random allocations, registrations and
evictions, publishes a batch per step, and delivers the batches through a channel that drops
and reorders them, with a snapshot every few steps: the index may miss keys, but it never
claims a key the pool does not hold for longer than the resync interval.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from builders import make_args, make_scheduler
from hypothesis import given, settings
from hypothesis import strategies as st

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_events import (
    KvEventBatch,
    KvEventLog,
    KvPublisher,
    KvSnapshot,
    RankLoad,
)
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.replica import kv_sender
from roundgate.deployment.routing.kv_hub import KvEventLogBook
from roundgate.routing.kv_index import KvIndex


def make_pool(num_pages: int = 8) -> tuple[KVPool, KvPublisher]:
    pool = KVPool(PoolConfig(num_pages, page_size=4))
    log = pool.events = KvEventLog()
    return pool, KvPublisher("r0", epoch=1, log=log, held=pool.cached_keys)


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def batch(seq: int, stored=(), removed=(), epoch: int = 1, source: str = "r0") -> KvEventBatch:
    return KvEventBatch(
        source, epoch, seq, tuple(map(key, stored)), tuple(map(key, removed)), RankLoad()
    )


def test_the_pool_notes_stored_keys_and_evictions_netted_per_drain() -> None:
    pool, publisher = make_pool(num_pages=2)
    for owner, k in (("a", 1), ("b", 2)):
        (page,) = pool.allocate(owner, 4)
        pool.register(page, key(k))
        pool.free(owner)  # keyed and free: evictable, still cached
    first = publisher.publish(RankLoad(), 0.0)
    assert first is not None and set(first.stored) == {key(1), key(2)} and first.removed == ()
    pool.allocate("c", 8)  # takes both pages: evicts both keys
    second = publisher.publish(RankLoad(), 1.0)
    assert second is not None and second.seq == first.seq + 1
    assert set(second.removed) == {key(1), key(2)} and second.stored == ()
    assert set(pool.cached_keys()) == set()
    # Nothing changed: no batch.
    assert publisher.publish(RankLoad(), 2.0) is None
    # Stored then evicted within one round: sent as removed only.
    pool.free("c")
    (page,) = pool.allocate("d", 4)
    pool.register(page, key(3))
    pool.free("d")
    pool.allocate("e", 8)
    third = publisher.publish(RankLoad(), 3.0)
    assert third is not None and third.stored == () and third.removed == (key(3),)


@pytest.mark.parametrize(
    ("batches", "held", "needs_resync"),
    [
        # In order: applied.
        ([batch(0, [1, 2]), batch(1, [3], [1])], {2, 3}, False),
        # Reordered: the late older batch is dropped, the gap asks for a snapshot.
        ([batch(0, [1]), batch(2, [3]), batch(1, [2])], {1, 3}, True),
        # A newer epoch (the rank restarted): its entry starts empty.
        ([batch(0, [1, 2]), batch(0, [5], epoch=2)], {5}, False),
        # An older epoch after a newer one: a dead rank's message, dropped.
        ([batch(0, [5], epoch=2), batch(7, [1], epoch=1)], {5}, False),
    ],
)
def test_the_index_applies_batches_in_order_per_epoch(batches, held, needs_resync) -> None:
    index = KvIndex()
    for b in batches:
        index.apply(b)
    assert index.keys("r0") == set(map(key, held))
    assert (index.needs_resync() == ["r0"]) is needs_resync


def test_a_snapshot_replaces_the_keys_unless_older_than_what_was_applied() -> None:
    index = KvIndex()
    index.apply(batch(0, [1]))
    index.apply(batch(2, [2]))  # gap: batch 1 may have removed key 1
    assert index.needs_resync() == ["r0"]
    assert index.resync(KvSnapshot("r0", 1, 2, frozenset({key(2)}), RankLoad()))
    assert index.keys("r0") == {key(2)} and index.needs_resync() == []
    assert not index.resync(KvSnapshot("r0", 1, 1, frozenset({key(9)}), RankLoad()))
    assert index.keys("r0") == {key(2)}


def test_a_rank_that_left_is_forgotten_and_comes_back_empty() -> None:
    index = KvIndex()
    index.apply(batch(0, [1, 2]))
    index.forget(["r0"])
    assert index.match("r0", [key(1)]) == 0 and index.sources() == []
    index.apply(batch(0, [7], epoch=2))
    assert index.keys("r0") == {key(7)}


SNAPSHOT_EVERY = 5
LAG = 2


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    loss=st.floats(0.0, 0.6),
    reorder=st.floats(0.0, 0.6),
)
def test_lost_and_reordered_events_never_claim_a_key_past_the_resync_interval(
    seed: int, loss: float, reorder: float
) -> None:
    rng = random.Random(seed)
    pool, publisher = make_pool(num_pages=12)
    index = KvIndex()
    line: list[tuple[int, KvEventBatch | KvSnapshot]] = []  # (due step, message)
    wrong_since: dict[bytes, int] = {}  # key -> first step the index claimed it wrongly
    owners: list[str] = []
    for step in range(200):
        # The rank: admit, key and free requests at random (evicting as pages run out).
        if owners and rng.random() < 0.5:
            pool.free(owners.pop(rng.randrange(len(owners))))
        else:
            owner = f"q{step}"
            pages = pool.allocate(owner, 4 * rng.randint(1, 3))
            if pages is not None:
                owners.append(owner)
                for page in pages:
                    if rng.random() < 0.8:
                        pool.register(page, key(rng.randrange(40)))
        sent = publisher.publish(RankLoad(), float(step))
        if sent is not None and rng.random() >= loss:
            delay = LAG + (rng.randint(1, 3) if rng.random() < reorder else 0)
            line.append((step + delay, sent))
        if step % SNAPSHOT_EVERY == 0:
            line.append((step + LAG, publisher.snapshot(RankLoad(), float(step))))
        # The router: take what is due, in arrival order (reordered ones arrive late).
        due = [m for d, m in line if d <= step]
        line = [(d, m) for d, m in line if d > step]
        for message in due:
            if isinstance(message, KvSnapshot):
                index.resync(message)
            else:
                index.apply(message)
        pool.check_integrity()
        held = set(pool.cached_keys())
        claimed = index.keys("r0")
        for k in claimed - held:
            wrong_since.setdefault(k, step)
        for k in [k for k in wrong_since if k not in claimed - held]:
            del wrong_since[k]
        # Wrong for at most: the lag plus one snapshot interval (plus the reorder delay).
        bound = SNAPSHOT_EVERY + LAG + 3
        stale = {k: step - s for k, s in wrong_since.items() if step - s > bound}
        assert not stale, f"step {step}: keys claimed but not held for {stale}"


def test_a_rank_sender_resyncs_the_hub_with_a_snapshot_after_dropping_batches(
    monkeypatch,
) -> None:
    monkeypatch.setattr(kv_sender, "LOOKUP_EVERY_S", 0.0)
    book = KvEventLogBook()
    hub = SimpleNamespace(publish=SimpleNamespace(remote=book.publish))
    reachable = [False]
    scheduler = make_scheduler(make_args(1, num_kv_pages=6, page_size=4))
    sender = kv_sender.KvEventSender(
        "r0",
        scheduler,
        send_interval_s=0.0,
        max_queued=2,
        lookup=lambda: hub if reachable[0] else None,
    )
    pool = scheduler.pool

    def one_round(step: int) -> None:
        (page,) = pool.allocate(f"q{step}", 4)
        pool.register(page, key(step))
        pool.free(f"q{step}")
        sender.after_round(0)

    for step in range(8):  # no hub: the bounded queue drops the oldest batches
        one_round(step)
    assert sender.num_dropped > 0 and book.index.sources() == []
    reachable[0] = True
    one_round(8)  # the hub is back: a snapshot first, so nothing dropped is missed
    one_round(9)
    (snapshot,) = book.poll(-1).snapshots
    assert snapshot.keys == frozenset(pool.cached_keys()) == frozenset(map(key, range(4, 10)))
