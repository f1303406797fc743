"""The router's view of what each rank holds, built from the ranks' own KV events.

Pure bookkeeping (no Ray: the simulator imports it). Per rank source, the index keeps the
keys the rank said it stored and has not said it removed, the rank's last ``RankLoad``, and
where it is in the rank's batch sequence:

- a batch of the current epoch with the next ``seq`` is applied;
- a batch from a *newer* epoch means the rank restarted: its entry starts over, empty;
- a batch with an older ``seq`` (reordered, or already covered by a snapshot) is dropped;
- a batch past a gap is applied, but the entry is marked ``needs_resync``: the missed batch
  may have removed keys the index still claims, until a ``KvSnapshot`` replaces the set.

So the index never claims a key the rank does not hold for longer than it takes a snapshot
to arrive (the resync interval), whatever is lost or reordered; it may miss keys the rank
holds, which costs only a cache hit.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from roundgate.actors.control.kv_events import KvEventBatch, KvSnapshot, RankLoad
from roundgate.actors.control.page_keys import PageKey, num_leading


@dataclass(slots=True)
class RankEntry:
    """One rank's keys and load as the router knows them."""

    epoch: int
    seq: int = -1  # last batch applied (or covered by a snapshot)
    keys: set[PageKey] = field(default_factory=set)
    load: RankLoad = field(default_factory=RankLoad)
    load_s: float = float("-inf")  # the publisher's clock when ``load`` was true
    needs_resync: bool = False


class KvIndex:
    """Per rank source: the keys it holds, its load, and whether it needs a snapshot."""

    def __init__(self) -> None:
        self._ranks: dict[Hashable, RankEntry] = {}
        self.num_applied = 0  # batches applied
        self.num_dropped = 0  # batches dropped (stale epoch or seq)
        self.num_gaps = 0  # gaps seen (each asks for a snapshot)
        self.num_resyncs = 0  # snapshots applied

    def apply(self, batch: KvEventBatch) -> bool:
        """Apply one batch if it is the entry's future; False when it is dropped."""
        entry = self._entry(batch.source, batch.epoch)
        if entry is None or batch.seq <= entry.seq:
            self.num_dropped += 1
            return False
        if batch.seq != entry.seq + 1:
            entry.needs_resync = True
            self.num_gaps += 1
        keys = entry.keys
        keys.difference_update(batch.removed)
        keys.update(batch.stored)
        entry.seq = batch.seq
        entry.load, entry.load_s = batch.load, batch.sent_s
        self.num_applied += 1
        return True

    def resync(self, snapshot: KvSnapshot) -> bool:
        """Replace a rank's keys by a snapshot (unless a newer batch was already applied:
        then the snapshot is older than what the index knows, and it is dropped)."""
        entry = self._entry(snapshot.source, snapshot.epoch)
        if entry is None or snapshot.seq < entry.seq:
            return False
        entry.keys = set(snapshot.keys)
        entry.seq = snapshot.seq
        entry.needs_resync = False
        if snapshot.sent_s >= entry.load_s:
            entry.load, entry.load_s = snapshot.load, snapshot.sent_s
        self.num_resyncs += 1
        return True

    def _entry(self, source: Hashable, epoch: int) -> RankEntry | None:
        """The source's entry for ``epoch``: a newer epoch starts an empty one; an older
        epoch's message is a dead rank's (None)."""
        entry = self._ranks.get(source)
        if entry is None or epoch > entry.epoch:
            entry = self._ranks[source] = RankEntry(epoch)
        elif epoch < entry.epoch:
            return None
        return entry

    def forget(self, sources: Iterable[Hashable]) -> None:
        """Drop ranks that left (their next life, if any, starts empty)."""
        for source in sources:
            self._ranks.pop(source, None)

    def sources(self) -> list[Hashable]:
        return list(self._ranks)

    def needs_resync(self) -> list[Hashable]:
        """Ranks whose last batches had a gap: they want a snapshot."""
        return [s for s, e in self._ranks.items() if e.needs_resync]

    def match(self, source: Hashable, keys: Sequence[PageKey]) -> int:
        """Leading pages of ``keys`` the rank is believed to hold."""
        entry = self._ranks.get(source)
        if entry is None:
            return 0
        return num_leading(keys, entry.keys)

    def load(self, source: Hashable) -> tuple[RankLoad, float]:
        """The rank's last load and the publisher's clock then (an empty load, -inf: none)."""
        entry = self._ranks.get(source)
        return (RankLoad(), float("-inf")) if entry is None else (entry.load, entry.load_s)

    def keys(self, source: Hashable) -> set[PageKey]:
        """The keys claimed for a rank (the live set: do not mutate)."""
        entry = self._ranks.get(source)
        return set() if entry is None else entry.keys

    def seq(self, source: Hashable) -> int:
        """The last batch applied for a rank (-1: none)."""
        entry = self._ranks.get(source)
        return -1 if entry is None else entry.seq

    def epoch(self, source: Hashable) -> int | None:
        entry = self._ranks.get(source)
        return None if entry is None else entry.epoch
