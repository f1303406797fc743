"""``/health`` of an elastic deployment: 200 while some group can serve, naming the degraded.

A gang deployment is healthy only when every rank is (one dead rank stops its whole group). An
elastic group serves on with fewer ranks while Serve replaces the lost one, so its ``/health``
stays 200 then, and its body says which groups run short (live ranks / expected, from the
ranks' ``roundgate_group_size``); it answers 503 only when no rank replica is running at all,
or when the Serve controller cannot say. The controller is read through ``CachedRead``: at most
once per period whatever the number of callers (``/health`` needs no key), off the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from roundgate.deployment.serve_context import RANK_DEPLOYMENT_OF

SIZE_SERIES = "roundgate_group_size"
T = TypeVar("T")


class CachedRead(Generic[T]):
    """A blocking read (of the Serve controller) made at most every ``max_age_s``, in a
    thread; concurrent callers share one read, and a failed read is kept (raised again) for
    the period too, so an outage is not answered with a read per request."""

    def __init__(
        self, read: Callable[[], T], max_age_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.read = read
        self.max_age_s = max_age_s
        self.clock = clock
        self._value: T | None = None
        self._error: Exception | None = None
        self._at: float | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> T:
        """The last read's value (or its exception) when fresh, else a new read's."""
        async with self._lock:
            now = self.clock()
            if self._at is None or now - self._at >= self.max_age_s:
                try:
                    self._value, self._error = await asyncio.to_thread(self.read), None
                except Exception as exc:
                    self._value, self._error = None, exc
                self._at = self.clock()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  (set by a successful read)


def group_sizes(exposition: str) -> dict[str, int]:
    """Each group's live ranks: the smallest size any of its ranks reports (a rank that was
    left out of the last re-form may still report the old, larger group for a moment)."""
    sizes: dict[str, int] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == SIZE_SERIES:
                group = sample.labels.get("group", "")
                size = int(sample.value)
                sizes[group] = min(size, sizes.get(group, size))
    return sizes


def health_body(
    sizes: dict[str, int], dp_size: int | Callable[[str], int], running: int, expected: int
) -> dict[str, Any]:
    """``{"status": "ok"}``, or ``"degraded"`` with the groups short of ranks and the rank
    replicas Serve runs against those it should. ``dp_size``: every group's size, or a
    group's by its id (P/D: each role's group has its own)."""
    size_of = dp_size if callable(dp_size) else (lambda group: dp_size)
    short = {
        g: {"live": n, "expected": size_of(g)} for g, n in sorted(sizes.items()) if n < size_of(g)
    }
    if not short and running >= expected:
        return {"status": "ok"}
    return {
        "status": "degraded",
        "groups": short,
        "rank_replicas": {"running": running, "expected": expected},
    }


def running_rank_replicas() -> int:
    """Rank replicas Serve reports running: the fused deployment's, or both P/D roles'."""
    from ray import serve

    running = 0
    for app in serve.status().applications.values():
        for name in RANK_DEPLOYMENT_OF.values():
            ranks = app.deployments.get(name)
            if ranks is not None:
                states = {
                    str(getattr(state, "value", state)): n
                    for state, n in ranks.replica_states.items()
                }
                running += states.get("RUNNING", 0)
    return running
