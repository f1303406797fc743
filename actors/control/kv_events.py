"""What a rank tells the routers: the page keys its pool stored and removed, and its load.

The pool notes every key it registers (``stored``) and every key whose page it overwrites
(``removed``, an eviction) into a ``KvEventLog``; once per round the rank's ``KvPublisher``
drains the log into one ``KvEventBatch`` (net per key: a key stored then evicted in the same
round is sent as removed) stamped with the rank's ``epoch`` and a sequence number, plus its
``RankLoad``. A router applies batches in order and resynchronizes from a ``KvSnapshot`` (every
key the pool holds) when it sees a gap, and periodically; a rank that restarts takes a new
epoch, so whatever a router believed about its previous life is dropped.

Pure data and bookkeeping (no Ray, no torch): the Serve shell and the simulator both use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from roundgate.actors.control.page_keys import PageKey

# The Ray actor the ranks send their batches to and the routers poll (deployment.routing.kv_hub).
HUB_NAME = "roundgate-kv-events"
# Its Ray namespace, named: ranks, routers and tools run in different jobs' namespaces.
HUB_NAMESPACE = "roundgate"


@dataclass(frozen=True, slots=True)
class RankLoad:
    """A rank's load and gate state as of one round (what the cost and gate-aware routers
    read besides the keys)."""

    num_running: int = 0
    num_waiting: int = 0
    backlog_tokens: int = 0  # prompt tokens of waiting requests still to prefill
    active_tokens: int = 0  # KV tokens held by unfinished requests (pages in use x page size)
    wants_prefill: bool = False  # the gate probe: this rank has prefill backlog
    has_decode_work: bool = False  # the gate probe: this rank decodes
    rounds_since_prefill: int = 0  # the gate's counter (0 under a policy without one)
    num_received: int = 0  # requests ever queued on the rank (routers match sends to it)


@dataclass(frozen=True, slots=True)
class KvEventBatch:
    """One round's changes on one rank. ``seq`` counts the rank's batches within ``epoch``
    from 0; ``sent_s`` is the publisher's clock (wall time live, simulated time in the sim)."""

    source: str
    epoch: int
    seq: int
    stored: tuple[PageKey, ...]
    removed: tuple[PageKey, ...]
    load: RankLoad
    sent_s: float = 0.0


@dataclass(frozen=True, slots=True)
class KvSnapshot:
    """Every key a rank's pool holds, as of its batch ``seq`` (the next batch is ``seq + 1``)."""

    source: str
    epoch: int
    seq: int
    keys: frozenset[PageKey]
    load: RankLoad
    sent_s: float = 0.0


class KvEventLog:
    """The pool's notes since the last drain: each key's latest change (True: stored)."""

    __slots__ = ("_changes", "num_removed", "num_stored")

    def __init__(self) -> None:
        self._changes: dict[PageKey, bool] = {}
        self.num_stored = 0  # totals, for the events/s figure
        self.num_removed = 0

    def stored(self, key: PageKey) -> None:
        self._changes[key] = True
        self.num_stored += 1

    def removed(self, key: PageKey) -> None:
        self._changes[key] = False
        self.num_removed += 1

    def __len__(self) -> int:
        return len(self._changes)

    def drain(self) -> tuple[tuple[PageKey, ...], tuple[PageKey, ...]]:
        """(stored, removed) since the last drain, net per key; the log starts over."""
        changes, self._changes = self._changes, {}
        stored = tuple(k for k, v in changes.items() if v)
        removed = tuple(k for k, v in changes.items() if not v)
        return stored, removed


class KvPublisher:
    """A rank's side of the channel: numbers its batches and answers snapshot requests.

    ``held`` reads the pool's current keys (``KVPool.cached_keys``); ``log`` is the pool's
    ``events``. A round with no key change and an unchanged load publishes nothing.
    """

    def __init__(
        self, source: str, epoch: int, log: KvEventLog, held: Callable[[], Iterable[PageKey]]
    ) -> None:
        self.source = source
        self.epoch = epoch
        self.log = log
        self._held = held
        self._seq = -1
        self._last_load: RankLoad | None = None
        self.num_batches = 0

    @property
    def seq(self) -> int:
        """The last batch's number (-1: none yet)."""
        return self._seq

    def publish(self, load: RankLoad, now_s: float) -> KvEventBatch | None:
        """This round's batch, or None when nothing changed since the last one."""
        if not len(self.log) and load == self._last_load:
            return None
        stored, removed = self.log.drain()
        self._seq += 1
        self._last_load = load
        self.num_batches += 1
        return KvEventBatch(self.source, self.epoch, self._seq, stored, removed, load, now_s)

    def snapshot(self, load: RankLoad, now_s: float) -> KvSnapshot:
        """Every key held now, as of the last batch (pending notes are published first by the
        caller, or they would be in the snapshot and again in the next batch: harmless)."""
        return KvSnapshot(self.source, self.epoch, self._seq, frozenset(self._held()), load, now_s)
