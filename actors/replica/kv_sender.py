"""A rank's side of the live KV-event channel: batches per round, sent to the hub actor.

The engine thread calls ``after_round`` once per round: the pool's notes become one
``KvEventBatch`` (``roundgate.actors.control.kv_events``), queued; every ``send_interval_s`` the
queue goes to the hub (``roundgate.deployment.routing.kv_hub``, looked up by name: the kv routers
create it) in one fire-and-forget call. The queue is bounded: while no hub can be reached the oldest
batches are dropped, and the next connection starts with a snapshot, so routers never apply
a gap silently. A new hub (another actor id) also gets a snapshot first.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from roundgate.actors.control.kv_events import (
    HUB_NAME,
    HUB_NAMESPACE,
    KvEventBatch,
    KvEventLog,
    KvPublisher,
    KvSnapshot,
)
from roundgate.actors.control.rank_load import rank_load
from roundgate.actors.control.scheduler import Scheduler

logger = logging.getLogger("roundgate.kv_events")
LOOKUP_EVERY_S = 1.0  # between lookups of a missing hub
RECHECK_EVERY_S = 10.0  # between lookups of a found one (a restarted hub has a new id)


class KvEventSender:
    """Publishes one rank's pool changes and load to the hub actor."""

    def __init__(
        self,
        source: str,
        scheduler: Scheduler,
        send_interval_s: float = 0.02,
        max_queued: int = 1024,
        lookup: Callable[[], Any] | None = None,
    ) -> None:
        self.scheduler = scheduler
        log = scheduler.pool.events = KvEventLog()
        # A new process is a new epoch: routers drop what they knew of the old one.
        self.publisher = KvPublisher(source, time.time_ns(), log, scheduler.pool.cached_keys)
        self.send_interval_s = send_interval_s
        self._queue: deque[KvEventBatch] = deque(maxlen=max_queued)
        self._hub: Any = None
        self._hub_id: Any = None
        self._needs_snapshot = True
        self._last_send = 0.0
        self._last_lookup = float("-inf")
        self.num_dropped = 0
        # The hub actor, or None while there is none (``ray.get_actor`` by name; tests pass
        # their own).
        self._find_hub = lookup or _ray_hub

    def after_round(self, rounds_since_prefill: int | None) -> None:
        """Queue this round's batch; send the queue if it is due (engine thread)."""
        now = time.time()
        batch = self.publisher.publish(rank_load(self.scheduler, rounds_since_prefill), now)
        if batch is not None:
            if len(self._queue) == self._queue.maxlen:
                self.num_dropped += 1
                self._needs_snapshot = True
            self._queue.append(batch)
        if now - self._last_send >= self.send_interval_s and (self._queue or self._needs_snapshot):
            self._send(now, rounds_since_prefill)

    def flush(self, rounds_since_prefill: int | None) -> None:
        """Send what is queued now (the group is about to pause: no round will follow)."""
        if self._queue or self._needs_snapshot:
            self._send(time.time(), rounds_since_prefill)

    def _send(self, now: float, rounds_since_prefill: int | None) -> None:
        hub = self._lookup(now)
        if hub is None:
            return
        messages: list[KvEventBatch | KvSnapshot] = []
        if self._needs_snapshot:
            # Everything held now, as of the last batch: queued batches before it are covered.
            self._queue.clear()
            load = rank_load(self.scheduler, rounds_since_prefill)
            messages.append(self.publisher.snapshot(load, now))
            self._needs_snapshot = False
        messages.extend(self._queue)
        self._queue.clear()
        self._last_send = now
        try:
            hub.publish.remote(messages)
        except Exception as exc:  # a dead hub: look it up again, and resync it
            logger.warning("KV events not sent (%s); will resync", exc)
            self._hub = None
            self._needs_snapshot = True

    def _lookup(self, now: float) -> Any:
        if self._hub is not None and now - self._last_lookup < RECHECK_EVERY_S:
            return self._hub
        if now - self._last_lookup < LOOKUP_EVERY_S:
            return None
        self._last_lookup = now
        hub = self._find_hub()
        if hub is None:  # no router made it yet (or it died with its router)
            self._hub = None
            return None
        hub_id = getattr(hub, "_actor_id", id(hub))
        if hub_id != self._hub_id:
            self._hub_id, self._needs_snapshot = hub_id, True
        self._hub = hub
        return hub

    def leave(self) -> None:
        """Tell the hub this rank is gone (best effort: the replica is shutting down)."""
        if self._hub is not None:
            # The hub or the cluster may be going away too.
            with contextlib.suppress(Exception):
                self._hub.leave.remote(self.publisher.source)


def _ray_hub() -> Any:
    import ray

    try:
        return ray.get_actor(HUB_NAME, namespace=HUB_NAMESPACE)
    except ValueError:
        return None
