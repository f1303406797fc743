"""Prefix caching through the live dp=2 deployment of the real default model.

Three sessions in two groups (sessions 0 and 1 share a system prompt, session 2 has its own),
served one request at a time in turn-major order (``test_kv_routing_served``). Three is odd,
so round-robin puts each session's consecutive turns, and the two sessions of a group, on
alternate ranks. Round-robin with caching (on the shared tiny deployment: no redeploy) stays
within the ceiling its prompts allow; the real model with caching and the cache-aware router
hits at least what a prefix-affine router does, which is more than round-robin could on the
same prompts (both computed from the prompts served); with caching off and round-robin every
greedy answer is the same, and nothing is looked up.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from test_kv_routing_served import (
    affine_floor,
    hits_arm,
    round_robin_ceiling,
)

from roundgate.sim.sessions import SESSION_WORKLOADS

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
GROUPS = (0, 0, 1)


def test_cache_aware_beats_round_robin_and_answers_as_without_caching(redeploy: Any) -> None:
    page_size = redeploy.args["page_size"]
    # Round-robin with caching: the shared deployment as it is (the tiny preset: the bound
    # holds for any model), on sessions of its own seed, never above its prompts' ceiling.
    if redeploy.overrides:
        redeploy.deploy()
    rr, rr_queries, rr_hits = hits_arm(redeploy, 3912, GROUPS, preset=PRESET)
    assert rr_queries == sum(len(s.prompt) for s in rr)
    assert rr_hits <= round_robin_ceiling(rr, page_size), rr_hits
    redeploy.deploy(model=MODEL, router="cache-aware", enable_prefix_caching=True)
    cached, queries, hits = hits_arm(redeploy, 3911, GROUPS, preset=PRESET)
    assert queries == sum(len(s.prompt) for s in cached)
    floor, ceiling = affine_floor(cached, page_size), round_robin_ceiling(cached, page_size)
    assert floor > ceiling, "the workload does not separate affinity from round-robin"
    assert hits >= floor, (
        f"cache-aware hit {hits} of {queries} prompt tokens; a prefix-affine router hits at "
        f"least {floor}, round-robin at most {ceiling}"
    )
    redeploy.deploy(model=MODEL, router="round-robin", enable_prefix_caching=False)
    plain, plain_queries, _ = hits_arm(redeploy, 3911, GROUPS, preset=PRESET)
    assert plain == cached  # the same greedy answers, every turn
    assert plain_queries == 0  # nothing looked up with caching off
