"""Request latencies recorded at the ingress (where the client's clock is), pushed to the hub."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from roundgate.actors.telemetry.metrics import RequestMetricSet
from roundgate.actors.telemetry.metrics_hub import Pusher, get_hub, snapshot
from roundgate.deployment.openai.errors import APIError

logger = logging.getLogger("roundgate.metrics")

# A killed hub's name is freed a moment after its death; the scrape that sees the dead actor
# asks for the hub again (a new one, once the name is free) this many times before a 503.
HUB_TRIES = 5
HUB_RETRY_S = 0.5
# What a 503 tells the scraper: a new hub is up within about a second of the old one's death.
HUB_RETRY_AFTER_S = 1


class RequestTimer:
    """TTFT, inter-token gaps and end-to-end time of one choice."""

    def __init__(self, recorder: RequestRecorder) -> None:
        self.recorder = recorder
        self.start = time.monotonic()
        self.last: float | None = None

    def tokens(self, count: int) -> None:
        """``count`` tokens arrived together (one streamed chunk)."""
        if count <= 0:
            return
        now = time.monotonic()
        m = self.recorder
        if self.last is None:
            m.ttft.observe(now - self.start)
            count -= 1
        elif count:
            gap = (now - self.last) / count
            for _ in range(count):
                m.itl.observe(gap)
        self.last = now

    def finish(self, reason: str | None, prompt_tokens: int, output_tokens: int) -> None:
        m = self.recorder
        m.e2e.observe(time.monotonic() - self.start)
        m.prompt_tokens.inc(prompt_tokens)
        m.generation_tokens.inc(output_tokens)
        m.finished_by(reason or "abort").inc()


class RequestRecorder:
    """The ingress replica's request metrics, bound to the served model's label."""

    def __init__(self, model: str) -> None:
        self.set = RequestMetricSet()
        s = self.set
        self.ttft = s.ttft.labels(model)
        self.itl = s.itl.labels(model)
        self.e2e = s.e2e.labels(model)
        self.prompt_tokens = s.prompt_tokens.labels(model)
        self.generation_tokens = s.generation_tokens.labels(model)
        self._model = model
        self._pusher = Pusher(f"ingress:{uuid.uuid4().hex[:12]}", lambda: snapshot(s.registry))

    def pd_transfer(self, decode_wait_s: float, transfer_s: float) -> None:
        """P/D: one request's wait for decode capacity and its KV transfer."""
        self.set.decode_wait.labels(self._model).observe(decode_wait_s)
        self.set.kv_transfer_time.labels(self._model).observe(transfer_s)

    def close(self) -> None:
        """This replica is shutting down: its series leave ``/metrics`` now."""
        self._pusher.stop()

    def resumed(self, kind: str) -> None:
        """One rank request resumed after a rank loss (``rerouted`` or ``continued``)."""
        self.set.requests_resumed.labels(self._model, kind).inc()

    def finished_by(self, reason: str) -> Any:
        return self.set.finished.labels(self._model, reason)

    def timer(self) -> RequestTimer:
        return RequestTimer(self)


async def exposition() -> bytes:
    """The merged exposition of every process of the application.

    The hub is one actor: killed (or lost with a node), the next call creates a new one, which
    the ranks find on their next push. Until the old one's name is freed, ``get_hub`` can still
    hand back the dead actor, so a failed call is retried; a hub still unreachable then is a 503
    naming it, not a 500 (``/health`` of an elastic deployment reads group sizes here too).
    """
    for attempt in range(1, HUB_TRIES + 1):
        try:
            return await get_hub().exposition.remote()
        except Exception as exc:  # the dead actor's error, or a new one's creation racing
            logger.warning("metrics hub call failed (%s: %s)", type(exc).__name__, exc)
            if attempt == HUB_TRIES:
                raise APIError(
                    503,
                    f"the metrics hub actor is unavailable: {type(exc).__name__}",
                    code="metrics_hub_unavailable",
                    headers={"Retry-After": str(HUB_RETRY_AFTER_S)},
                ) from exc
            await asyncio.sleep(HUB_RETRY_S)
    raise AssertionError("HUB_TRIES must be >= 1")
