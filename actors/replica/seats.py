"""Seats: which replica is rank ``s`` of group ``g`` when the ranks are not a Serve gang.

An elastic deployment's rank replicas are plain replicas, so Serve replaces a dead one by
itself; what a gang context gave (the group, the rank) comes from here instead. There are
``num_groups * dp_size`` seats per deployment. A starting replica takes the first free seat
with an atomic put-if-absent; when a member leaves a group (a new epoch formed without it),
the epoch's rank 0 frees its seat, and the replacement Serve starts takes it: it gets the
same ``dp_rank`` (what pinned requests and the routers name) and joins the running group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


class SeatStore(Protocol):
    def put_if_absent(self, key: str, value: str) -> str: ...

    def get(self, key: str) -> str | None: ...

    def delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class Seat:
    """A replica's place: its group (index) and its dp_rank within it."""

    group: int
    dp_rank: int


def _key(deployment: str, seat: Seat) -> str:
    return f"roundgate/seats/{deployment}/{seat.group}/{seat.dp_rank}"


def beat(store: SeatStore, deployment: str, me: str, now: float | None = None) -> None:
    """Say ``me`` is alive (every second or so, running or paused)."""
    key = f"roundgate/seats/{deployment}/beat/{me}"
    store.delete(key)
    store.put_if_absent(key, repr(time.time() if now is None else now))


def alive(store: SeatStore, deployment: str, who: str, stale_s: float, now: float) -> bool:
    """Whether ``who`` beat within ``stale_s`` (a holder that never beat counts as alive:
    it is still loading its model)."""
    value = store.get(f"roundgate/seats/{deployment}/beat/{who}")
    return value is None or now - float(value) <= stale_s


def claim(
    store: SeatStore,
    deployment: str,
    num_groups: int,
    dp_size: int,
    me: str,
    stale_s: float = 30.0,
) -> Seat:
    """The first free seat, taken for ``me`` (or the one ``me`` already holds); a seat whose
    holder stopped beating ``stale_s`` ago is free (it died while its group was idle, so no
    re-form has freed it yet). ``RuntimeError`` when every seat is held."""
    now = time.time()
    for group in range(num_groups):
        for dp_rank in range(dp_size):
            seat = Seat(group, dp_rank)
            key = _key(deployment, seat)
            held = store.put_if_absent(key, me)
            if held != me and not alive(store, deployment, held, stale_s, now):
                store.delete(key)
                held = store.put_if_absent(key, me)
            if held == me:
                beat(store, deployment, me, now)
                return seat
    raise RuntimeError(
        f"deployment {deployment}: all {num_groups} x {dp_size} rank seats are held; "
        "a replica beyond num_groups * dp_size has no group to join"
    )


def holder(store: SeatStore, deployment: str, seat: Seat) -> str | None:
    return store.get(_key(deployment, seat))


def release(store: SeatStore, deployment: str, seat: Seat, me: str) -> None:
    """Free ``seat`` if ``me`` holds it (a left member's seat, freed by a survivor)."""
    if store.get(_key(deployment, seat)) == me:
        store.delete(_key(deployment, seat))


def release_departed(
    store: SeatStore, deployment: str, group: int, dp_size: int, members: set[str]
) -> list[Seat]:
    """Free the group's seats whose holders are not ``members`` (the epoch just formed);
    returns them. Run by the epoch's rank 0 alone."""
    freed = []
    for dp_rank in range(dp_size):
        seat = Seat(group, dp_rank)
        held = store.get(_key(deployment, seat))
        if held is not None and held not in members:
            store.delete(_key(deployment, seat))
            freed.append(seat)
    return freed
