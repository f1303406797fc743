"""``roundgate bench --sessions``: multi-turn conversations against a live deployment.

Each session sends its turns one after another: a turn's prompt is the previous prompt, the
token ids the server answered (``return_token_ids``) and the next message, sent ``think_s``
after the answer ended, as ``roundgate.sim.sessions`` builds them for the simulator. The
session's id travels as the API's ``user`` field (the cache-aware router's affinity key).
The deployment's prefix-cache hit rate is read from its ``/metrics`` before and after.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import httpx

from roundgate.bench.client import RequestResult, one_request
from roundgate.sim.sessions import Session

HIT_COUNTERS = ("roundgate_prefix_cache_queries", "roundgate_prefix_cache_hits")


async def run_sessions(
    url: str,
    model: str,
    sessions: Sequence[Session],
    api_key: str | None = None,
    on_done: Callable[[RequestResult], None] | None = None,
    timeout_s: float = 600.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[list[RequestResult], float]:
    """Every session's turns in order, sessions concurrently from their start times."""
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=max(len(sessions), 16))
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, transport=transport) as client:
        t0 = time.monotonic()

        async def converse(session: Session) -> None:
            turn = session.first_turn()
            while turn is not None:
                delay = turn.time_s - (time.monotonic() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                ids = list(turn.token_ids or ())
                user = f"session-{session.session_id}"
                res = await one_request(client, url, model, turn, ids, t0, api_key, True, user)
                res.session = session.session_id
                results.append(res)
                if on_done:
                    on_done(res)
                if not res.ok:
                    return  # the conversation cannot go on without its answer
                turn = session.next_turn(turn, time.monotonic() - t0, res.output_token_ids)

        await asyncio.gather(*(converse(s) for s in sessions))
        duration = time.monotonic() - t0
    return results, duration


def scrape_metrics(url: str, api_key: str | None = None) -> str | None:
    """The deployment's ``/metrics`` text (None when it cannot be read)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return response.text


# One rank's (queries, hits), keyed by the series' labels (group, model, dp_rank).
HitCounters = dict[tuple[tuple[str, str], ...], tuple[float, float]]


def hit_counters(scrape: str | None) -> HitCounters | None:
    """The prefix-cache (queries, hits) in tokens of one scrape, per rank series."""
    from prometheus_client.parser import text_string_to_metric_families

    if scrape is None:
        return None
    out: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for family in text_string_to_metric_families(scrape):
        if family.name not in HIT_COUNTERS:
            continue
        column = HIT_COUNTERS.index(family.name)
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = tuple(sorted(sample.labels.items()))
                out.setdefault(key, [0.0, 0.0])[column] += sample.value
    return {key: (q, h) for key, (q, h) in out.items()}


def scrape_settled(url: str, api_key: str | None = None, max_wait_s: float = 10.0) -> str | None:
    """``/metrics`` once the load's last counts have reached it.

    Each process pushes its series to the metrics hub once a second (``PUSH_INTERVAL_S``),
    so a scrape right after the last response can miss that response's own counts (a served
    test read the same too-low hit rate, 0.195, twice). Scrapes a push interval
    apart until the hit counters stop moving, at most ``max_wait_s``."""
    from roundgate.actors.telemetry.metrics_hub import PUSH_INTERVAL_S

    gap = 1.5 * PUSH_INTERVAL_S
    text = scrape_metrics(url, api_key)
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() + gap <= deadline:
        time.sleep(gap)
        later = scrape_metrics(url, api_key)
        if hit_counters(later) == hit_counters(text):
            return later
        text = later
    return text


def read_hit_counters(
    url: str, api_key: str | None = None, settle: bool = False
) -> HitCounters | None:
    """The deployment's prefix-cache (queries, hits) in tokens, per rank series (None when
    its ``/metrics`` cannot be read); ``settle``: after a load, wait for its last counts."""
    text = scrape_settled(url, api_key) if settle else scrape_metrics(url, api_key)
    return hit_counters(text)


def hit_rate(before: HitCounters | None, after: HitCounters | None) -> float | None:
    """Hits over queries between two readings (None when unread or nothing was looked up).

    Series by series, over the ranks the later reading holds: a redeployed group's series can
    linger in the first reading and be gone from the second, which must not count."""
    if before is None or after is None:
        return None
    queries = hits = 0.0
    for key, (q, h) in after.items():
        q0, h0 = before.get(key, (0.0, 0.0))
        queries, hits = queries + q - q0, hits + h - h0
    return round(hits / queries, 4) if queries > 0 else None
