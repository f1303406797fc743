"""Prefix caching in one rank's scheduler: reuse, the one-token floor, LRU, pressure, aborts.

Pages of 4 tokens. Every round runs through ``ContentExecutor``, which checks that each chunk
reads its own tokens from its pages and never writes into a shared one.
"""

from __future__ import annotations

import pytest
from builders import make_args
from kv_content import ContentExecutor

from roundgate.actors.control.prefix_cache import PrefixCache
from roundgate.actors.control.request import Request, RequestStatus, SamplingParams
from roundgate.actors.control.round import RoundPlan
from roundgate.actors.control.scheduler import Scheduler
from roundgate.gate.permission import ALLOW_ALL, Permission

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]  # two full pages and two tokens


def make(caching: bool = True, **flags) -> tuple[Scheduler, ContentExecutor]:
    sched = Scheduler(make_args(1, "none", enable_prefix_caching=caching, **flags))
    return sched, ContentExecutor(sched)


def request(rid: str, prompt: list[int], max_tokens: int = 2) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens))


def step(sched: Scheduler, ex: ContentExecutor, permission: Permission = ALLOW_ALL) -> RoundPlan:
    plan = sched.plan(permission)
    sched.update(plan, ex.execute(plan))
    sched.pool.check_integrity()
    return plan


def finish(sched: Scheduler, ex: ContentExecutor, *reqs: Request) -> None:
    for req in reqs:
        sched.add_request(req)
    while sched.has_unfinished:
        step(sched, ex)


def first_chunk(plan: RoundPlan, rid: str) -> tuple[int, int]:
    chunk = next(c for c in plan.chunks if c.request.request_id == rid)
    return chunk.start, chunk.num_tokens


@pytest.mark.parametrize(
    ("caching", "second", "chunk", "hits", "copies"),
    [
        # The first prompt's two full pages are reused; its partial page never is.
        (True, PROMPT, (8, 2), 8, 0),
        (True, [*PROMPT[:9], 99], (8, 2), 8, 0),
        (True, PROMPT[:6] + [99] * 4, (4, 6), 4, 0),
        (True, [99, *PROMPT[1:]], (0, 10), 0, 0),
        # Every page cached: share one, copy the other, recompute exactly the last token.
        (True, PROMPT[:8], (7, 1), 7, 1),
        (True, PROMPT[:4], (3, 1), 3, 1),
        (False, PROMPT, (0, 10), 0, 0),
    ],
)
def test_a_prompt_reuses_its_longest_cached_page_aligned_prefix(
    caching: bool, second: list[int], chunk: tuple[int, int], hits: int, copies: int
) -> None:
    sched, ex = make(caching)
    finish(sched, ex, request("a", PROMPT))
    assert sched.pool.num_used_pages == 0
    assert sched.pool.num_cached_pages == (2 if caching else 0)  # (the output page: 11 tokens)
    queries_before, hits_before = sched.prefix.num_queries, sched.prefix.num_hits
    sched.add_request(request("b", second))
    plan = step(sched, ex)
    assert first_chunk(plan, "b") == chunk
    assert plan.num_tokens == chunk[1]  # the round, its budget and its row see only this
    assert len(plan.page_copies) == copies
    assert sched.prefix.num_hits - hits_before == hits
    assert sched.prefix.num_queries - queries_before == (len(second) if caching else 0)
    finish(sched, ex)
    assert ex.first_start["b"] == hits


def test_outputs_and_their_pages_are_cached_for_the_next_turn() -> None:
    sched, ex = make()
    turn1 = request("t1", PROMPT[:6], max_tokens=7)
    finish(sched, ex, turn1)
    # Turn 2 resends turn 1 and its answer (12 computed tokens: three full pages), then more.
    turn2 = request("t2", turn1.prompt_token_ids + turn1.output_token_ids + [42, 43])
    sched.add_request(turn2)
    assert first_chunk(step(sched, ex), "t2") == (12, 3)


def test_cached_pages_stay_until_their_slots_are_needed_least_recent_first() -> None:
    sched, ex = make(num_kv_pages=6)
    finish(sched, ex, request("a", [1] * 8, max_tokens=1))
    finish(sched, ex, request("b", [2] * 8, max_tokens=1))
    assert (sched.pool.num_cached_pages, sched.pool.num_used_pages) == (4, 0)
    assert sched.pool.occupancy == 0.0  # cached, unheld pages count as free for the watermark
    # Five pages for a 19-token prompt: the two plain free pages, then a's (released first),
    # then b's tail (a sequence is released tail first).
    finish(sched, ex, request("c", [3] * 19, max_tokens=1))
    sched.add_request(request("b2", [2] * 8 + [7]))
    sched.add_request(request("a2", [1] * 8 + [7]))
    plan = step(sched, ex)
    assert first_chunk(plan, "b2")[0] == 4
    assert first_chunk(plan, "a2")[0] == 0


def test_abort_of_a_sharing_request_leaves_the_other_intact() -> None:
    sched, ex = make()
    finish(sched, ex, request("seed", PROMPT, max_tokens=1))
    a, b = request("a", PROMPT, max_tokens=6), request("b", [*PROMPT, 1], max_tokens=6)
    sched.add_request(a)
    sched.add_request(b)
    step(sched, ex)
    shared = a.page_ids[:2]
    assert b.page_ids[:2] == shared and [sched.pool.num_holders(p) for p in shared] == [2, 2]
    sched.abort("a")
    step(sched, ex)
    assert [sched.pool.num_holders(p) for p in shared] == [1, 1]
    finish(sched, ex)
    assert b.status is RequestStatus.FINISHED_LENGTH and b.num_output_tokens == 6


def test_a_retraction_before_its_copy_ran_parks_the_copy_source() -> None:
    """(Today's plan order never retracts a prompt admitted in the same round; if it did, the
    parked K/V must be read from the copy's source, and the copy into a freed page dropped.)"""
    plan = RoundPlan(page_copies=[(3, 7), (4, 8)])
    old_pages = [1, 2, 7]
    PrefixCache.retarget_copies(old_pages, plan)
    assert old_pages == [1, 2, 3] and plan.page_copies == [(4, 8)]


def test_a_prompt_that_would_not_fit_is_requeued_without_counting_a_hit() -> None:
    sched, ex = make(num_kv_pages=3)
    finish(sched, ex, request("seed", PROMPT[:8], max_tokens=1))
    sched.pool.allocate("ballast", 12)  # every page: the cached ones are evicted
    sched.add_request(request("b", PROMPT[:8]))
    plan = step(sched, ex)
    assert not plan.chunks and sched.queues.waiting[0].num_computed_tokens == 0
    assert sched.prefix.num_hits == 0
