"""The simulated KV-event channel from the ranks' pools to the router's ``KvIndex``.

The same messages as live (``roundgate.actors.control.kv_events``): each rank's pool logs stored and
removed keys, drained into one batch per round (per fast-forwarded step: those rounds only
decode); a batch reaches the router ``lag_rounds`` rounds later, or never (``loss_rate``,
seeded); every ``snapshot_rounds`` rounds each rank also sends a snapshot (never lost), and a
rank whose batches showed a gap gets one at the next round. The router's index is therefore
the ranks' truth up to the lag, and wrong for at most a snapshot interval after a loss.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from roundgate.actors.control.kv_events import (
    KvEventBatch,
    KvEventLog,
    KvPublisher,
    KvSnapshot,
    RankLoad,
)
from roundgate.actors.control.rank_load import rank_load
from roundgate.actors.control.scheduler import Scheduler
from roundgate.routing.kv_index import KvIndex


@dataclass(frozen=True)
class ChannelSpec:
    """How the channel delivers (``--kv-event-lag-rounds`` etc.; validated: names the flag)."""

    lag_rounds: int = 1
    loss_rate: float = 0.0
    snapshot_rounds: int = 256

    def __post_init__(self) -> None:
        if self.lag_rounds < 0:
            raise ValueError(f"--kv-event-lag-rounds must be >= 0, got {self.lag_rounds}")
        if not 0.0 <= self.loss_rate < 1.0:
            raise ValueError(f"--kv-event-loss must be in [0, 1), got {self.loss_rate}")
        if self.snapshot_rounds < 1:
            raise ValueError(f"--kv-snapshot-rounds must be >= 1, got {self.snapshot_rounds}")


class KvChannel:
    """Publishers on the ranks' pools, a delay line, and the index it feeds."""

    def __init__(
        self,
        spec: ChannelSpec,
        schedulers: list[Scheduler],
        index: KvIndex,
        seed: int = 0,
        rounds_since_prefill: Callable[[int], int | None] | None = None,
    ) -> None:
        self.spec = spec
        self.index = index
        self.schedulers = schedulers
        self._rng = random.Random(seed)
        self._gate = rounds_since_prefill
        self.publishers: list[KvPublisher] = []
        for rank, scheduler in enumerate(schedulers):
            log = scheduler.pool.events = KvEventLog()
            self.publishers.append(KvPublisher(str(rank), 0, log, scheduler.pool.cached_keys))
        # (due round, message), in publish order: one lag, so also in due order.
        self._line: deque[tuple[int, KvEventBatch | KvSnapshot]] = deque()
        self._last_snapshot = 0
        self._asked: set[str] = set()  # ranks whose snapshot is on its way
        self.num_batches = 0
        self.num_lost = 0
        self.num_events = 0

    def tick(self, round_no: int, now_s: float) -> None:
        """After a round (or a fast-forwarded step) ending at ``round_no``: publish, then
        deliver what is due."""
        lag, loss = self.spec.lag_rounds, self.spec.loss_rate
        line, rng = self._line, self._rng
        for rank, publisher in enumerate(self.publishers):
            num = len(publisher.log)
            batch = publisher.publish(self._load(rank), now_s)
            if batch is None:
                continue
            self.num_batches += 1
            self.num_events += num
            if loss and rng.random() < loss:
                self.num_lost += 1
                continue
            line.append((round_no + lag, batch))
        periodic = round_no - self._last_snapshot >= self.spec.snapshot_rounds
        wanted = {s for s in self.index.needs_resync() if s not in self._asked}
        if periodic or wanted:
            if periodic:
                self._last_snapshot = round_no
            for rank, publisher in enumerate(self.publishers):
                if periodic or publisher.source in wanted:
                    self._asked.add(publisher.source)
                    line.append((round_no + lag, publisher.snapshot(self._load(rank), now_s)))
        while line and line[0][0] <= round_no:
            message = line.popleft()[1]
            if isinstance(message, KvSnapshot):
                self._asked.discard(message.source)
                self.index.resync(message)
            else:
                self.index.apply(message)

    def _load(self, rank: int) -> RankLoad:
        since = self._gate(rank) if self._gate is not None else None
        return rank_load(self.schedulers[rank], since)
