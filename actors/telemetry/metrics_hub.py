"""One ``/metrics`` for the whole application, whichever ingress replica answers the scrape.

Every process (rank replicas, ingress replicas) pushes a snapshot of its own registry to one
named Ray actor, the hub, about once a second. A scrape renders the hub's merge: samples with
the same name and labels are summed (counters and histogram buckets add up across ingress
replicas; rank series carry ``dp_rank``/``group`` labels and never collide). A source that
shuts down (a replaced replica) drops its series at once (``Pusher.stop``); one that stops
pushing without a word (a killed process) is dropped after ``STALE_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

logger = logging.getLogger("roundgate.metrics")

HUB_NAME = "roundgate-metrics-hub"
HUB_NAMESPACE = "roundgate"
PUSH_INTERVAL_S = 1.0
STALE_S = 30.0
# A source whose numbers have not moved still pushes this often, to stay under ``STALE_S``.
KEEPALIVE_S = STALE_S / 3

# (family name, type, help, [(sample name, labels, value)])
Family = tuple[str, str, str, list[tuple[str, dict[str, str], float]]]


def snapshot(registry: CollectorRegistry) -> list[Family]:
    """A picklable copy of a registry's samples, without ``_created`` timestamps."""
    out: list[Family] = []
    for metric in registry.collect():
        samples = [
            (s.name, dict(s.labels), float(s.value))
            for s in metric.samples
            if not s.name.endswith("_created")
        ]
        out.append((metric.name, metric.type, metric.documentation, samples))
    return out


def merge(snapshots: Iterable[list[Family]]) -> list[Family]:
    """Sum samples with equal (name, labels) across sources; keep family order stable."""
    families: dict[str, tuple[str, str, dict[tuple, tuple[str, dict[str, str], float]]]] = {}
    for snap in snapshots:
        for name, kind, doc, samples in snap:
            _, _, merged = families.setdefault(name, (kind, doc, {}))
            for sample_name, labels, value in samples:
                key = (sample_name, tuple(sorted(labels.items())))
                prev = merged.get(key)
                merged[key] = (sample_name, labels, value + (prev[2] if prev else 0.0))
    return [
        (name, kind, doc, list(m.values())) for name, (kind, doc, m) in sorted(families.items())
    ]


class _Merged:
    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        for name, kind, doc, samples in self.families:
            metric = Metric(name, doc, kind)
            for sample_name, labels, value in samples:
                metric.add_sample(sample_name, labels, value)
            yield metric


def render(families: list[Family]) -> bytes:
    """Prometheus text exposition of merged families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(families))
    return generate_latest(registry)


class MetricsHub:
    """The Ray actor holding the latest snapshot of every source."""

    def __init__(self) -> None:
        self._sources: dict[str, tuple[float, list[Family]]] = {}

    def push(self, source: str, families: list[Family]) -> None:
        self._sources[source] = (time.monotonic(), families)

    def drop(self, source: str) -> None:
        self._sources.pop(source, None)

    def exposition(self) -> bytes:
        now = time.monotonic()
        for source in [s for s, (t, _) in self._sources.items() if now - t > STALE_S]:
            del self._sources[source]
        return render(merge(f for _, f in self._sources.values()))


def get_hub() -> Any:
    """The application's hub actor, created on first use (any process may be first)."""
    import ray

    from roundgate.actors.head_node import on_head_node

    return (
        ray.remote(MetricsHub)
        .options(
            name=HUB_NAME,
            namespace=HUB_NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=16,
            **on_head_node(),
        )
        .remote()
    )


class Pusher:
    """A daemon thread pushing ``collect()`` to the hub every ``PUSH_INTERVAL_S``."""

    def __init__(
        self,
        source: str,
        collect: Callable[[], list[Family]],
        version: Callable[[], int] | None = None,
    ) -> None:
        """``version``, when given, changes whenever the numbers may have (a rank's round
        count): an unchanged version skips the snapshot and the push, but a keep-alive every
        ``KEEPALIVE_S``. An idle rank then costs nothing a second."""
        # Imported here, on the caller's thread: ray's package init is not safe to race
        # against another thread's first ``import ray`` (a partially initialised module).
        import ray

        self.source = source
        self.collect = collect
        self.version = version
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Outside Ray (unit tests, the offline engine) there is no hub: no thread either.
        # Replicas are made inside their Ray worker, so this is never a Ray process that
        # joins a cluster later; a thread started here anyway would outlive its owner and,
        # once the process did join one (a test session's driver), push under a source
        # nobody drops, once a second.
        if ray.is_initialized():
            self._thread = threading.Thread(target=self._run, name="metrics-push", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        import ray

        hub = None
        last_push = None  # the previous push's result: a dead hub shows up there
        pushed_version: int | None = None
        pushed_at = -KEEPALIVE_S
        while not self._stop.wait(PUSH_INTERVAL_S):
            if not ray.is_initialized():
                return  # the process left its cluster (it is shutting down)
            if last_push is not None:
                try:
                    if ray.wait([last_push], timeout=0)[0]:
                        ray.get(last_push)
                        last_push = None
                except Exception as exc:  # its hub died (with its node), or the cluster did
                    logger.warning(
                        "metrics hub lost (%s); pushing to a new one", type(exc).__name__
                    )
                    hub, pushed_version, last_push = None, None, None
            version = self.version() if self.version is not None else None
            now = time.monotonic()
            if version is not None and version == pushed_version and now - pushed_at < KEEPALIVE_S:
                continue
            try:
                hub = hub or get_hub()
                last_push = hub.push.remote(self.source, self.collect())
                pushed_version, pushed_at = version, now
            except Exception as exc:  # the hub may be restarting; try again next tick
                logger.debug("metrics push failed: %s", exc)
                hub = None

    def stop(self, leave: bool = True) -> None:
        """Stop pushing and (``leave``) take this source's series off the hub now, so a
        replaced replica's numbers do not linger beside its successor's for ``STALE_S``."""
        self._stop.set()
        if not leave or self._thread is None:
            return
        # A push in flight would put the series back after the drop.
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * PUSH_INTERVAL_S)
        try:
            import ray

            if ray.is_initialized():
                get_hub().drop.remote(self.source)
        except Exception as exc:  # the hub or the cluster may be going away too
            logger.debug("metrics source %s not dropped: %s", self.source, exc)
