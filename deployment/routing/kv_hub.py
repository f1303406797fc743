"""The live KV-event channel: one hub actor between the ranks and every ingress replica's router.

Ranks (``roundgate.actors.replica.kv_sender``) send their per-round ``KvEventBatch``es to the hub, a
few rounds at a time; the hub applies them to its own ``KvIndex`` (the ranks' truth, in each
rank's order: one caller's calls to a plain actor run in order) and keeps the last
``max_batches`` in a bounded log under a hub-wide cursor. Each router polls with the cursor it
reached: it gets the batches since then, or, when it fell behind the bounded log (or is new,
or asks after a gap it saw), a snapshot of every rank from the hub's index. So each router's
index is the ranks' truth up to the send interval plus the poll interval.

``KvEventLogBook`` is the hub's logic, plain Python (tests drive it without Ray);
``hub_actor`` returns the named Ray actor, created by the first router that asks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roundgate.actors.control.kv_events import HUB_NAME, HUB_NAMESPACE, KvEventBatch, KvSnapshot
from roundgate.routing.kv_index import KvIndex


@dataclass(frozen=True)
class KvPoll:
    """A router's share of the hub since ``cursor``: batches, or snapshots when it must
    resynchronize (then ``batches`` is empty), and ranks that left."""

    cursor: int
    batches: tuple[KvEventBatch, ...] = ()
    snapshots: tuple[KvSnapshot, ...] | None = None
    gone: tuple[str, ...] = ()


@dataclass
class HubStats:
    """Events/s and lag, for the note: counted since the hub started."""

    started_s: float = field(default_factory=time.time)
    num_batches: int = 0
    num_events: int = 0  # keys stored + removed
    num_snapshots_sent: int = 0
    lag_s: deque[float] = field(default_factory=lambda: deque(maxlen=4096))  # send -> hub

    def as_dict(self) -> dict[str, float]:
        elapsed = max(1e-9, time.time() - self.started_s)
        lags = sorted(self.lag_s)
        return {
            "batches_per_s": self.num_batches / elapsed,
            "events_per_s": self.num_events / elapsed,
            "snapshots_sent": float(self.num_snapshots_sent),
            "lag_p50_ms": 1000 * lags[len(lags) // 2] if lags else 0.0,
            "lag_p99_ms": 1000 * lags[min(len(lags) - 1, len(lags) * 99 // 100)] if lags else 0.0,
        }


class KvEventLogBook:
    """The hub: the ranks' index and a bounded log of their batches under one cursor."""

    def __init__(self, max_batches: int = 8192) -> None:
        if max_batches < 1:
            raise ValueError(f"max_batches must be >= 1, got {max_batches}")
        self.index = KvIndex()
        self._log: deque[tuple[int, KvEventBatch]] = deque(maxlen=max_batches)
        self._cursor = 0
        self._gone: deque[tuple[int, str]] = deque(maxlen=max_batches)
        self._resync_cursor = 0  # a rank (re)connected here: routers before it resync
        self.stats = HubStats()
        self._pollers: dict[str, int] = {}  # router -> the cursor its last poll reached

    def publish(self, messages: Sequence[KvEventBatch | KvSnapshot]) -> None:
        """A rank's batches (and, after it (re)connects, its snapshot first), in its order."""
        now = time.time()
        for message in messages:
            if isinstance(message, KvSnapshot):
                self.index.resync(message)
                # Routers take the new keys at their next poll, from a snapshot.
                self._cursor += 1
                self._resync_cursor = self._cursor
                continue
            if self.index.apply(message):
                self._cursor += 1
                self._log.append((self._cursor, message))
                self.stats.num_batches += 1
                self.stats.num_events += len(message.stored) + len(message.removed)
                self.stats.lag_s.append(max(0.0, now - message.sent_s))

    def leave(self, source: str) -> None:
        """A rank stopped (its replica is going away): routers drop it."""
        self.index.forget([source])
        self._cursor += 1
        self._gone.append((self._cursor, source))

    def poll(self, cursor: int, resync: bool = False, poller: str | None = None) -> KvPoll:
        """What a router at ``cursor`` lacks (a new router passes -1); ``poller`` names the
        router, so ``pollers`` shows how far each one has read."""
        if poller is not None:
            self._pollers[poller] = self._cursor
        oldest = self._log[0][0] if self._log else self._cursor + 1
        behind = cursor + 1 < oldest or cursor < self._resync_cursor
        if resync or cursor < 0 or behind:
            self.stats.num_snapshots_sent += 1
            return KvPoll(self._cursor, snapshots=tuple(self.snapshots()))
        batches = tuple(b for c, b in self._log if c > cursor)
        gone = tuple(s for c, s in self._gone if c > cursor)
        return KvPoll(self._cursor, batches, None, gone)

    def snapshots(self) -> list[KvSnapshot]:
        """Every rank's keys and load as the hub holds them."""
        out = []
        for source in self.index.sources():
            load, load_s = self.index.load(source)
            epoch = self.index.epoch(source)
            seq = self.index.seq(source)
            keys = frozenset(self.index.keys(source))
            out.append(KvSnapshot(str(source), epoch or 0, seq, keys, load, load_s))
        return out

    def pollers(self) -> dict[str, int]:
        """Each router that named itself -> the hub cursor its last poll reached: a router
        at cursor ``c`` holds every rank's events up to ``c``."""
        return dict(self._pollers)

    def cursor(self) -> int:
        return self._cursor

    def stats_dict(self) -> dict[str, float]:
        return self.stats.as_dict()


def hub_actor(namespace: str = HUB_NAMESPACE) -> Any:
    """The named hub actor, created if no router made it yet (one per cluster); None outside
    a Ray worker or driver (a router built without a cluster must not start one)."""
    import ray

    if not ray.is_initialized():
        return None

    from roundgate.actors.head_node import on_head_node

    cls = ray.remote(num_cpus=0, max_concurrency=1)(KvEventLogBook)
    return cls.options(
        name=HUB_NAME, namespace=namespace, get_if_exists=True, **on_head_node()
    ).remote()
