"""The kv-aware and gate-aware routers through the live dp=2 deployment (tiny preset).

The ranks publish their pools' stored/removed keys to the hub actor; the router polls it.
Multi-turn sessions must reuse cached prefixes, and the hub must have seen the ranks' events
and hold keys for both ranks.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.sessions import hit_rate, read_hit_counters, run_sessions
from sim.sessions import SessionSpec, make_sessions
from tests.integration.helpers import SMALL_CHAT_SESSIONS

PRESET = SMALL_CHAT_SESSIONS


def run(app: Any) -> float | None:
    sessions = make_sessions(SessionSpec(PRESET, num_sessions=4, rate=20.0, vocab_size=256))
    before = read_hit_counters(app.url, settle=True)
    model = app.args["model"]
    results, _ = asyncio.run(run_sessions(app.url, model, sessions, timeout_s=300))
    assert all(r.ok for r in results), [r.error for r in results]
    return hit_rate(before, read_hit_counters(app.url, settle=True))


def hub_call(method: str) -> Any:
    import ray

    from actors.control.kv_events import HUB_NAME, HUB_NAMESPACE

    hub = ray.get_actor(HUB_NAME, namespace=HUB_NAMESPACE)
    return ray.get(getattr(hub, method).remote(), timeout=30)


def test_kv_aware_routes_on_the_ranks_events(redeploy: Any) -> None:
    redeploy.deploy(router="kv-aware", enable_prefix_caching=True)
    rate = run(redeploy)
    assert rate is not None and rate > 0.3
    stats = hub_call("stats_dict")
    assert stats["batches_per_s"] > 0 and stats["events_per_s"] > 0
    # Once idle, the hub holds keys for each rank (one snapshot per rank).
    time.sleep(1.0)
    snapshots = hub_call("snapshots")
    assert len(snapshots) == 2
    assert all(s.keys for s in snapshots)


def test_gate_aware_serves_under_the_gate(redeploy: Any) -> None:
    redeploy.deploy(router="gate-aware", enable_prefix_caching=True)
    rate = run(redeploy)
    assert rate is not None and rate > 0.3
