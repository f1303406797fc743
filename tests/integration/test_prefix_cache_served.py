"""Prefix caching through the live dp=2 deployment of the real default model.

The same multi-turn sessions (``roundgate bench --sessions``' client) run against the
deployment with caching and the cache-aware router, then with caching off and round-robin:
every greedy answer must be the same, and only the first run may have reused tokens.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from bench.sessions import hit_rate, read_hit_counters, run_sessions
from sim.sessions import SESSION_WORKLOADS, SessionSpec, make_sessions

MODEL = "smollm2-135m-instruct"
PRESET = replace(
    SESSION_WORKLOADS["chat-sessions"],
    system_len=40,
    first_user_len=12,
    user_len=10,
    output_len=6,
    turns=3,
    think_s=0.05,
)


def answers(app: Any) -> tuple[dict[tuple[int, int], list[int]], float | None]:
    sessions = make_sessions(SessionSpec(PRESET, num_sessions=3, rate=20.0, vocab_size=256))
    before = read_hit_counters(app.url, settle=True)
    results, _ = asyncio.run(run_sessions(app.url, MODEL, sessions, timeout_s=300))
    assert all(r.ok for r in results), [r.error for r in results]
    assert len(results) == 3 * PRESET.turns
    rate = hit_rate(before, read_hit_counters(app.url, settle=True))
    return {(r.session, r.turn): r.output_token_ids for r in results}, rate


def test_greedy_sessions_answer_the_same_with_and_without_caching(redeploy: Any) -> None:
    redeploy.deploy(model=MODEL, router="cache-aware", enable_prefix_caching=True)
    cached, cached_rate = answers(redeploy)
    redeploy.deploy(model=MODEL, router="round-robin", enable_prefix_caching=False)
    plain, plain_rate = answers(redeploy)
    assert cached == plain
    assert all(ids for ids in cached.values())
    assert cached_rate is not None and cached_rate > 0.3
    assert plain_rate is None  # nothing looked up with caching off
