"""Membership epochs of one DP group: after a fault, the live ranks agree who is in the group.

A group runs in epochs. Epoch ``e`` has a fixed, ordered list of member ids (stable names of
the rank replicas, not ranks) and its own process group; a member's rank in the epoch is its
index in the list, so ranks stay contiguous while members keep their identity. An epoch ends
when a collective fails (a killed peer resets its connections, noticed at once; a hung one
times the collective out) or when members are asked to admit a joiner. Each live member then
calls ``next_epoch``:

1. it registers for ``e + 1`` in the store;
2. it waits, at most ``window_s``, until every member it expects has registered too (the dead
   never do, so a fault costs at most the window);
3. the first proposal written for ``e + 1`` wins (an atomic put-if-absent): it lists the members
   registered when it was made, in the previous epoch's order, then joiners by arrival;
4. a member missing from the decided list is *fenced*: it was hung past the window, and the
   group went on without it. It must not join an old group or answer for any request that
   moved; it raises ``Fenced`` and its replica restarts.

A replacement joins the same way: it registers as a joiner for ``e + 1``; the members see it at
their next round boundary (``joiners``) and move to ``e + 1`` together with it.

The store is the group's rendezvous store: Ray's internal KV in a served group
(``RayKvStore``), any ``torch.distributed.Store`` in tests (``TorchStore``). Only keys under the
group's prefix are touched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

POLL_S = 0.02


class Fenced(RuntimeError):
    """This member's epoch was superseded without it: it must restart, not rejoin."""


@dataclass(frozen=True)
class Epoch:
    """One membership: the epoch number, its members in rank order, and this member's rank."""

    group: str
    number: int
    members: tuple[str, ...]
    me: str

    @property
    def rank(self) -> int:
        return self.members.index(self.me)

    @property
    def world_size(self) -> int:
        return len(self.members)


class MembershipStore(Protocol):
    """The four operations the protocol needs of a key-value store."""

    def put_if_absent(self, key: str, value: str) -> str:
        """Store ``value`` unless ``key`` holds one; return what ``key`` holds after."""
        ...

    def get(self, key: str) -> str | None: ...

    def append(self, key: str, value: str) -> None:
        """Add ``value`` to the list at ``key`` (concurrent appends all land)."""
        ...

    def items(self, key: str) -> list[str]:
        """The list at ``key``, in the order appended."""
        ...


def first_epoch(store: MembershipStore, group: str, me: str, members: Sequence[str]) -> Epoch:
    """Epoch 0, as the group was started (every member knows the list: the gang's ranks)."""
    decided = store.put_if_absent(_key(group, 0, "members"), json.dumps(list(members)))
    return _epoch(group, 0, decided, me)


def join_request(store: MembershipStore, group: str, number: int, me: str) -> None:
    """Register ``me`` for epoch ``number`` (a survivor after a fault, or a joiner)."""
    store.append(_key(group, number, "join"), me)


def joiners(store: MembershipStore, epoch: Epoch) -> list[str]:
    """Who asked to join the next epoch without being a member of this one: members poll this
    at a round boundary, and move to the next epoch when it is not empty."""
    return [m for m in _registered(store, epoch.group, epoch.number + 1) if m not in epoch.members]


def next_epoch(
    store: MembershipStore,
    epoch: Epoch,
    window_s: float,
    expected: Sequence[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Epoch:
    """Move from ``epoch`` to the next one with whoever registers in time (see the module
    docstring). ``expected``: the members to wait for (default: this epoch's members and the
    joiners already registered); the wait ends early once all of them have registered.
    Raises ``Fenced`` when the next epoch was decided without this member."""
    number = epoch.number + 1
    decided_key = _key(epoch.group, number, "members")
    join_request(store, epoch.group, number, epoch.me)
    wanted = set(epoch.members if expected is None else expected)
    wanted |= set(joiners(store, epoch)) if expected is None else set()
    deadline = clock() + window_s
    while True:
        decided = store.get(decided_key)
        if decided is not None:
            return _epoch(epoch.group, number, decided, epoch.me)
        registered = _registered(store, epoch.group, number)
        if wanted <= set(registered) or clock() >= deadline:
            break
        time.sleep(POLL_S)
    proposal = order(epoch.members, registered)
    return _epoch(
        epoch.group, number, store.put_if_absent(decided_key, json.dumps(proposal)), epoch.me
    )


def wait_admitted(
    store: MembershipStore, group: str, number: int, me: str, timeout_s: float
) -> Epoch:
    """A joiner's side: wait until epoch ``number`` is decided, and be in it (else
    ``Fenced``: register for a later one). ``TimeoutError`` if nobody decides in time."""
    deadline = time.monotonic() + timeout_s
    key = _key(group, number, "members")
    while (decided := store.get(key)) is None:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"group {group}: epoch {number} not decided in {timeout_s:g}s")
        time.sleep(POLL_S)
    return _epoch(group, number, decided, me)


def current_number(store: MembershipStore, group: str, since: int = 0) -> int:
    """The newest decided epoch of ``group`` at or after ``since``."""
    number = since
    while store.get(_key(group, number + 1, "members")) is not None:
        number += 1
    return number


def order(previous: Sequence[str], registered: Sequence[str]) -> list[str]:
    """The next epoch's members: the previous members still registered, in their order (so
    survivors keep their relative ranks), then joiners in the order they registered."""
    seen = set(registered)
    kept = [m for m in previous if m in seen]
    return kept + [m for m in dict.fromkeys(registered) if m not in previous]


def _epoch(group: str, number: int, decided: str, me: str) -> Epoch:
    members = tuple(json.loads(decided))
    if me not in members:
        raise Fenced(
            f"group {group}: epoch {number} was formed without {me} (members {list(members)}); "
            "it must restart rather than rejoin"
        )
    return Epoch(group, number, members, me)


def registered(store: MembershipStore, group: str, number: int) -> list[str]:
    """Who registered for epoch ``number``, in order."""
    return store.items(_key(group, number, "join"))


def decided_members(store: MembershipStore, group: str, number: int) -> list[str]:
    """Epoch ``number``'s members, or [] while it is undecided."""
    value = store.get(_key(group, number, "members"))
    return [] if value is None else list(json.loads(value))


def decide(store: MembershipStore, group: str, number: int, members: Sequence[str]) -> None:
    """Propose epoch ``number``'s members (the first proposal stands)."""
    store.put_if_absent(_key(group, number, "members"), json.dumps(list(members)))


_registered = registered


def _key(group: str, number: int, what: str) -> str:
    return f"roundgate/membership/{group}/{number}/{what}"


class TorchStore:
    """``MembershipStore`` (and ``seats.SeatStore``) over a ``torch.distributed.Store``
    (File/TCP/Hash store)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def delete(self, key: str) -> None:
        self.store.delete_key(key)

    def put_if_absent(self, key: str, value: str) -> str:
        return self.store.compare_set(key, "", value).decode()

    def put(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def get(self, key: str) -> str | None:
        if not self.store.check([key]):
            return None
        return self.store.get(key).decode()

    def append(self, key: str, value: str) -> None:
        index = self.store.add(key + "/n", 1)
        self.store.set(f"{key}/{index}", value)

    def items(self, key: str) -> list[str]:
        if not self.store.check([key + "/n"]):
            return []
        count = self.store.add(key + "/n", 0)
        out = []
        for index in range(1, count + 1):
            item = f"{key}/{index}"
            if self.store.check([item]):  # an append between its add and its set: not yet
                out.append(self.store.get(item).decode())
        return out


class RayKvStore:
    """``MembershipStore`` (and ``seats.SeatStore``) over Ray's internal KV, the served
    group's rendezvous store."""

    def delete(self, key: str) -> None:
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(key.encode())

    def put_if_absent(self, key: str, value: str) -> str:
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

        _internal_kv_put(key.encode(), value.encode(), overwrite=False)
        return _internal_kv_get(key.encode()).decode()

    def put(self, key: str, value: str) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(key.encode(), value.encode(), overwrite=True)

    def get(self, key: str) -> str | None:
        from ray.experimental.internal_kv import _internal_kv_get

        value = _internal_kv_get(key.encode())
        return None if value is None else value.decode()

    def append(self, key: str, value: str) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        # One key per entry, named by the member and a clock stamp: no read-modify-write.
        _internal_kv_put(f"{key}/{time.time_ns():020d}/{value}".encode(), value.encode())

    def items(self, key: str) -> list[str]:
        from ray.experimental.internal_kv import _internal_kv_list

        entries = sorted(k.decode() for k in _internal_kv_list((key + "/").encode()))
        return [entry.rsplit("/", 1)[1] for entry in entries]
