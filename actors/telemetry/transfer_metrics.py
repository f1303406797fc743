"""Records one P/D rank's KV transfers into its ``RankMetricSet`` (labelled with the role)."""

from __future__ import annotations

from roundgate.actors.telemetry.metrics import RankMetricSet


class TransferMetrics:
    """Pages, bytes, time and failures of this rank's transfers, and its waiting handoffs."""

    def __init__(self, metrics: RankMetricSet, group: str, model: str, rank: int, role: str):
        labels = (group, model, str(rank), role)
        self._pages = metrics.kv_transfer_pages.labels(*labels)
        self._bytes = metrics.kv_transfer_bytes.labels(*labels)
        self._time = metrics.kv_transfer_time.labels(*labels)
        self._failures = metrics.kv_transfer_failures.labels(*labels)
        self._waiting = metrics.pd_waiting.labels(*labels)
        self._expired = metrics.pd_handoffs_expired.labels(*labels)
        self._waiting.set(0)
        self._expired.inc(0)
        self._failures.inc(0)  # the series exists (at 0) from the start, for rate()

    def transferred(self, num_pages: int, num_bytes: int, seconds: float) -> None:
        self._pages.inc(num_pages)
        self._bytes.inc(num_bytes)
        self._time.observe(seconds)

    def failed(self) -> None:
        self._failures.inc()

    def expired(self, count: int) -> None:
        self._expired.inc(count)

    def set_waiting(self, count: int) -> None:
        self._waiting.set(count)
