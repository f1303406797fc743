"""Seats: which replica is rank ``s`` of group ``g`` when the ranks are not a Serve gang.

An elastic deployment's rank replicas are plain replicas, so Serve replaces a dead one by
itself; what a gang context gave (the group, the rank) comes from here instead. There are
``num_groups * dp_size`` seats per deployment. A starting replica takes the first free seat
with an atomic put-if-absent; when a member leaves a group (a new epoch formed without it),
the epoch's rank 0 frees its seat, and the replacement Serve starts takes it: it gets the
same ``dp_rank`` (what pinned requests and the routers name) and joins the running group.

Under ``gang_placement: spread`` a replica also says which node it runs on, and takes a seat
in the group with the fewest members on that node: Serve places replicas, not groups, so this
is what keeps a node's loss down to one rank per group where the nodes allow. Those claims are
taken one at a time (a short lock in the store), so two replicas starting on one node at once
see each other's node.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

LOCK_STALE_S = 10.0  # a claim lock older than this was left by a replica that died claiming


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


def beat(
    store: SeatStore,
    deployment: str,
    me: str,
    now: float | None = None,
    seat: Seat | None = None,
) -> None:
    """Say ``me`` is alive (every second or so, running or paused); with ``seat``, also take
    it back if it was freed while ``me`` held it, so no replacement can sit there too."""
    _put(
        store, f"roundgate/seats/{deployment}/beat/{me}", repr(time.time() if now is None else now)
    )
    if seat is not None:
        store.put_if_absent(_key(deployment, seat), me)


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
    node: str | None = None,
) -> Seat:
    """The first free seat, taken for ``me`` (or the one ``me`` already holds); a seat whose
    holder stopped beating ``stale_s`` ago is free (it died while its group was idle, so no
    re-form has freed it yet). With ``node``, groups are tried fewest members on that node
    first. ``RuntimeError`` when every seat is held."""
    if node is None:
        return _take_first(store, deployment, range(num_groups), dp_size, me, stale_s)
    with _claim_lock(store, deployment, me):
        _put(store, _node_key(deployment, me), node)
        crowd = [
            sum(
                _node_of(store, deployment, holder(store, deployment, Seat(group, r)), me) == node
                for r in range(dp_size)
            )
            for group in range(num_groups)
        ]
        order = sorted(range(num_groups), key=lambda group: crowd[group])
        return _take_first(store, deployment, order, dp_size, me, stale_s)


def _take_first(
    store: SeatStore,
    deployment: str,
    groups: Iterable[int],
    dp_size: int,
    me: str,
    stale_s: float,
) -> Seat:
    now = time.time()
    groups = list(groups)
    for group in groups:
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
        f"deployment {deployment}: all {len(groups)} x {dp_size} rank seats are held; "
        "a replica beyond num_groups * dp_size has no group to join"
    )


def _node_key(deployment: str, who: str) -> str:
    return f"roundgate/seats/{deployment}/node/{who}"


def _node_of(store: SeatStore, deployment: str, who: str | None, me: str) -> str | None:
    """The node a seat's holder said it runs on (None: a free seat, or ``me``'s own)."""
    if who is None or who == me:
        return None
    return store.get(_node_key(deployment, who))


def _put(store: SeatStore, key: str, value: str) -> None:
    store.delete(key)
    store.put_if_absent(key, value)


@contextmanager
def _claim_lock(store: SeatStore, deployment: str, me: str) -> Iterator[None]:
    """One spread claim at a time per deployment (a claim is a few store calls)."""
    key = f"roundgate/seats/{deployment}/claiming"
    mine = f"{me}@{time.time()!r}"
    while True:
        held = store.put_if_absent(key, mine)
        if held == mine:
            break
        if time.time() - float(held.rpartition("@")[2]) > LOCK_STALE_S:
            store.delete(key)
            continue
        time.sleep(0.02)
    try:
        yield
    finally:
        if store.get(key) == mine:
            store.delete(key)


def holder(store: SeatStore, deployment: str, seat: Seat) -> str | None:
    return store.get(_key(deployment, seat))


def release(store: SeatStore, deployment: str, seat: Seat, me: str) -> None:
    """Free ``seat`` if ``me`` holds it (a left member's seat, freed by a survivor)."""
    if store.get(_key(deployment, seat)) == me:
        store.delete(_key(deployment, seat))


def release_departed(
    store: SeatStore, deployment: str, group: int, dp_size: int, departed: set[str]
) -> list[Seat]:
    """Free the group's seats held by ``departed`` (members of the last epoch that the one
    just formed left out); returns them. Run by the new epoch's rank 0 alone. A holder that
    was never a member is still loading its model, and keeps its seat."""
    freed = []
    for dp_rank in range(dp_size):
        seat = Seat(group, dp_rank)
        held = store.get(_key(deployment, seat))
        if held is not None and held in departed:
            store.delete(_key(deployment, seat))
            freed.append(seat)
    return freed
