"""Seats of an elastic deployment: a replica's group and stable dp_rank without a gang."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from roundgate.actors.replica import seats
from roundgate.actors.replica.membership import TorchStore

DEP = "dep1"


@pytest.fixture
def store() -> TorchStore:
    return TorchStore(dist.HashStore())


def test_replicas_take_the_seats_in_order_and_keep_their_own(store: TorchStore) -> None:
    got = [seats.claim(store, DEP, 2, 2, f"r{i}") for i in range(4)]
    assert got == [seats.Seat(0, 0), seats.Seat(0, 1), seats.Seat(1, 0), seats.Seat(1, 1)]
    assert seats.claim(store, DEP, 2, 2, "r2") == seats.Seat(1, 0)  # asked again: the same
    with pytest.raises(RuntimeError, match="all 2 x 2 rank seats are held"):
        seats.claim(store, DEP, 2, 2, "r9")


def test_a_departed_members_seat_goes_to_its_replacement(store: TorchStore) -> None:
    for i in range(2):
        seats.claim(store, DEP, 1, 2, f"r{i}")
    # The epoch formed without r1: its rank 0 frees r1's seat, and only that one.
    assert seats.release_departed(store, DEP, 0, 2, {"r1"}) == [seats.Seat(0, 1)]
    assert seats.claim(store, DEP, 1, 2, "new") == seats.Seat(0, 1)
    assert seats.holder(store, DEP, seats.Seat(0, 0)) == "r0"


def test_a_seat_whose_holder_stopped_beating_is_free(store: TorchStore) -> None:
    seats.claim(store, DEP, 1, 1, "old")
    seats.beat(store, DEP, "old", now=0.0)  # long ago: it died while its group was idle
    assert seats.claim(store, DEP, 1, 1, "new", stale_s=30.0) == seats.Seat(0, 0)
    assert seats.holder(store, DEP, seats.Seat(0, 0)) == "new"


def test_a_beating_holder_keeps_its_seat(store: TorchStore) -> None:
    seats.claim(store, DEP, 1, 1, "live")  # claiming beats
    with pytest.raises(RuntimeError, match="seats are held"):
        seats.claim(store, DEP, 1, 1, "other", stale_s=30.0)


def test_release_frees_only_a_seat_one_holds(store: TorchStore) -> None:
    seat = seats.claim(store, DEP, 1, 1, "a")
    seats.release(store, DEP, seat, "b")
    assert seats.holder(store, DEP, seat) == "a"
    seats.release(store, DEP, seat, "a")
    assert seats.holder(store, DEP, seat) is None


def groups_by_node(store: TorchStore, placed: dict[str, str], num_groups: int) -> list[list[str]]:
    """Each group's members' nodes, sorted."""
    return [
        sorted(placed[seats.holder(store, DEP, seats.Seat(g, r)) or ""] for r in range(2))
        for g in range(num_groups)
    ]


def test_spread_claims_put_each_group_on_different_nodes(store: TorchStore) -> None:
    """Replicas start node by node (both of node a first): without the node, they would fill
    group 0 from node a; with it, each group gets one rank on each node."""
    placed = {"a0": "a", "a1": "a", "b0": "b", "b1": "b"}
    for me, node in placed.items():
        seats.claim(store, DEP, 2, 2, me, node=node)
    assert groups_by_node(store, placed, 2) == [["a", "b"], ["a", "b"]]


def test_spread_claims_racing_from_threads_still_spread(store: TorchStore) -> None:
    """Claims made at once (replicas of one node starting together) are serialized by the
    claim lock, so each sees the others' nodes."""
    from concurrent.futures import ThreadPoolExecutor

    placed = {f"{node}{i}": node for node in "abc" for i in range(3)}
    with ThreadPoolExecutor(len(placed)) as pool:
        list(pool.map(lambda me: seats.claim(store, DEP, 3, 3, me, node=placed[me]), placed))
    for g in range(3):
        nodes = sorted(placed[seats.holder(store, DEP, seats.Seat(g, r)) or ""] for r in range(3))
        assert nodes == ["a", "b", "c"], (g, nodes)


def test_a_claim_lock_left_by_a_dead_replica_is_broken(store: TorchStore) -> None:
    store.put_if_absent(f"roundgate/seats/{DEP}/claiming", "dead@0.0")  # long ago
    assert seats.claim(store, DEP, 1, 1, "r0", node="a") == seats.Seat(0, 0)
    assert store.get(f"roundgate/seats/{DEP}/claiming") is None  # released after the claim


def test_a_holder_that_never_joined_keeps_its_seat(store: TorchStore) -> None:
    """r0 formed the group's first epoch alone while r1 still loaded: r1 never departed, so
    its seat stays, and no replacement takes dp_rank 1 beside it."""
    for i in range(2):
        seats.claim(store, DEP, 1, 2, f"r{i}")
    assert seats.release_departed(store, DEP, 0, 2, set()) == []
    assert seats.holder(store, DEP, seats.Seat(0, 1)) == "r1"


def test_a_beat_takes_back_a_seat_freed_under_its_holder(store: TorchStore) -> None:
    seat = seats.claim(store, DEP, 1, 1, "r0")
    seats.release(store, DEP, seat, "r0")  # freed while r0 still serves
    seats.beat(store, DEP, "r0", seat=seat)
    assert seats.holder(store, DEP, seat) == "r0"
    with pytest.raises(RuntimeError, match="seats are held"):
        seats.claim(store, DEP, 1, 1, "replacement")
