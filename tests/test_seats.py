"""Seats of an elastic deployment: a replica's group and stable dp_rank without a gang."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from actors.replica import seats
from actors.replica.membership import TorchStore

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
    assert seats.release_departed(store, DEP, 0, 2, {"r0"}) == [seats.Seat(0, 1)]
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
