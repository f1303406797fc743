"""The scheduler's horizon (``steady.horizon``, ``steady.page_grants``, ``skip_decode_rounds``:
k steady decode rounds at once, the simulator's fast path) is the contract of k held rounds of
``plan``/``publish_probe``/``update``: each case runs one scheduler through the rounds and one
through the skip, and compares everything the rounds touch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from builders import make_request, make_scheduler
from scheduler_rounds import add, decoding, fill_pool, pressured_trio, run_round, sampled

from roundgate.actors.control.request import RequestStatus
from roundgate.actors.control.round import TokenEvent
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.control.steady_decodes import FAR_ROUNDS
from roundgate.gate.permission import ALLOW_ALL, HOLD_ALL

TOKEN = 7  # what every decode samples (no request stops on it)


def state(sched: Scheduler) -> tuple:
    """Everything a round changes: the round counter, each request, the pool's pages and keys,
    the queues and the admission-wait accounting."""
    pool = sched.pool
    requests = [
        (r.request_id, list(r.output_token_ids), r.num_computed_tokens, list(r.page_ids), r.status)
        for r in sched.queues.running
    ]
    return (
        sched.round,
        requests,
        sorted(sched.queues.requests),
        [(r.request_id, r.first_want_round) for r in sched.queues.waiting],
        sched.excused_rounds,
        (list(pool._free), list(pool._evictable), dict(pool._key_of), pool.num_evictions),
    )


def summary(events: list[TokenEvent]) -> list[tuple[str, int | None, bool]]:
    return [(e.request.request_id, e.token_id, e.finished) for e in events]


def full_round(sched: Scheduler) -> list[TokenEvent]:
    """A held round as ``RankLoop`` runs it: plan under HOLD_ALL, publish, update."""
    plan = sched.plan(HOLD_ALL)
    sched.publish_probe()
    return sched.update(plan, sampled(plan, TOKEN))


def steady_rank(caching: bool = False, **overrides: object) -> Scheduler:
    """Three requests past their prefill, decoding, ending at different lengths."""
    sched = make_scheduler(enable_prefix_caching=caching, **overrides)
    for i, (prompt_len, max_tokens) in enumerate([(5, 9), (3, 6), (6, 12)]):
        sched.add_request(make_request(f"d{i}", prompt_len, max_tokens, token=10 + i))
    run_round(sched, ALLOW_ALL, token=TOKEN)
    assert all(r.status is RequestStatus.DECODING for r in sched.queues.running)
    return sched


def hold_a_prompt(sched: Scheduler) -> None:
    sched.add_request(make_request("held", 4))


def fill_the_batch(sched: Scheduler) -> None:
    """A fourth decoding request (the batch holds four), then a prompt that waits for a slot."""
    sched.add_request(make_request("d3", 2, 20, token=20))
    run_round(sched, ALLOW_ALL, token=TOKEN)
    sched.add_request(make_request("held", 4))


def waiting_prompt(sched: Scheduler) -> None:
    add(sched, 4)


def resident_chunk(sched: Scheduler) -> None:
    add(sched, 30)  # longer than the 16-token budget: stays resident after one chunk
    sched.plan(ALLOW_ALL)


def pending_abort(sched: Scheduler) -> None:
    sched.abort(sched.queues.running[0].request_id)


def pending_failure_event(sched: Scheduler) -> None:
    sched.ends.fail(sched.queues.running[0], "injected")


@pytest.mark.parametrize(
    ("make_busy", "is_steady"),
    [
        (waiting_prompt, True),  # steady: the fast path asks the votes about the prompt
        (resident_chunk, False),
        (pending_abort, False),
        (pending_failure_event, False),
    ],
)
def test_a_rank_with_other_work_is_not_steady(
    make_busy: Callable[[Scheduler], None], is_steady: bool
) -> None:
    sched = steady_rank()
    assert sched.is_steady
    make_busy(sched)
    assert sched.is_steady is is_steady


def test_a_retracting_rank_is_not_steady() -> None:
    sched, _, _, c = pressured_trio(b_max_tokens=16)
    assert sched.is_steady
    run_round(sched, HOLD_ALL)  # a needs a page only retracting c frees
    assert list(sched.queues.retracted) == [c] and not sched.is_steady


@pytest.mark.parametrize("caching", [False, True])
def test_the_horizon_is_the_first_finish_and_the_first_page_grant(caching: bool) -> None:
    sched = steady_rank(caching)
    first_end, first_grant = sched.steady.horizon()
    end = grant = None
    for j in range(1, 20):
        pages = sched.pool.num_used_pages
        events = full_round(sched)
        if grant is None and sched.pool.num_used_pages > pages:
            grant = j - 1  # rounds before the granting one
        if end is None and any(e.finished for e in events):
            end = j
    assert (first_end, first_grant) == (end, grant)
    assert make_scheduler().steady.horizon() == (FAR_ROUNDS, FAR_ROUNDS)


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize(
    "prepare", [None, hold_a_prompt, fill_the_batch], ids=["alone", "held", "full-batch"]
)
@pytest.mark.parametrize("k", [1, 2, 3, "horizon"])
def test_k_skipped_rounds_are_k_full_rounds(
    k: int | str, prepare: Callable[[Scheduler], None] | None, caching: bool
) -> None:
    full, fast = steady_rank(caching), steady_rank(caching)
    if prepare is not None:
        prepare(full)
        prepare(fast)
    assert fast.is_steady
    horizon = fast.steady.horizon()[0]
    rounds = horizon if k == "horizon" else k
    assert isinstance(rounds, int) and rounds <= horizon
    grants = fast.steady.page_grants(rounds)
    assert grants is not None
    for _ in range(rounds):
        events = full_round(full)
    finished = fast.skip_decode_rounds(rounds, grants, TOKEN, horizon)
    assert [r.request_id for r in finished] == [rid for rid, _, done in summary(events) if done]
    assert bool(finished) == (k == "horizon")
    assert state(fast) == state(full)


def test_page_grants_are_the_full_rounds_grants_in_their_order() -> None:
    full, fast = steady_rank(num_kv_pages=64), steady_rank(num_kv_pages=64)
    k = fast.steady.horizon()[0]  # up to the first finish
    grants = fast.steady.page_grants(k)
    assert grants is not None and len({req.request_id for _, _, req in grants}) > 1
    seen = []
    for j in range(k):
        held = {r.request_id: len(r.page_ids) for r in full.queues.running}
        full_round(full)
        seen += [
            (j, r.request_id) for r in full.queues.running if len(r.page_ids) > held[r.request_id]
        ]
    assert [(j, req.request_id) for j, _, req in grants] == seen
    assert all(fast.queues.running[order] is req for _, order, req in grants)


def test_page_grants_refuse_a_pool_that_runs_short() -> None:
    sched = steady_rank(num_kv_pages=8)
    fill_pool(sched, sched.pool.num_free_pages)
    assert sched.steady.page_grants(1) == []  # no page needed yet
    assert sched.steady.page_grants(9) is None


@pytest.mark.parametrize("waiting", [False, True])
def test_page_grants_refuse_to_carry_the_pool_across_the_watermark(waiting: bool) -> None:
    """A waiting prompt's probe reads the watermark: k rounds that cross it are not steady."""
    sched = make_scheduler(num_kv_pages=20)
    (req,) = decoding(sched, (3, 16))  # one page, full after its next decode
    fill_pool(sched, 17)  # 18 of 20 pages: at the watermark, not over
    if waiting:
        add(sched, 4)
    grants = sched.steady.page_grants(2)  # round 1 takes a page: 19 of 20
    assert grants == (None if waiting else [(1, 0, req)])
