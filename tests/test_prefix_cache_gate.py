"""What the gate and the peers see with prefix caching: only the uncached work.

The gathered row's token count, the round budget, the mixed-batch reserve and the peers' KV
column count what a rank will compute, not the prompt's length; the 0.9 watermark treats
cached pages nobody holds as free.
"""

from __future__ import annotations

from builders import drive_round, make_args, make_loops
from kv_content import ContentExecutor

from roundgate.actors.control.columns import READERS
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.scheduler import Scheduler
from roundgate.gate.permission import ALLOW_ALL

SYSTEM = list(range(10, 34))  # six pages of 4


def cached_loop(**flags):
    args = make_args(1, "none", enable_prefix_caching=True, num_kv_pages=16, **flags)
    (loop,) = make_loops(args)
    loop.executor = ContentExecutor(loop.scheduler)
    return loop


def run_to_end(loop, *reqs: Request) -> None:
    for req in reqs:
        loop.scheduler.add_request(req)
    while loop.scheduler.has_unfinished:
        drive_round([loop])


def test_the_gathered_row_counts_only_uncached_prompt_tokens() -> None:
    loop = cached_loop()
    run_to_end(loop, Request("a", [*SYSTEM, 1], SamplingParams(max_tokens=1)))
    loop.scheduler.add_request(Request("b", [*SYSTEM, 2, 3, 4], SamplingParams(max_tokens=1)))
    (outcome,) = drive_round([loop])
    row = outcome.rows[0]
    assert (row.num_tokens, row.num_extends) == (3, 1)
    # The budget of 16 tokens was not spent on the 24 cached ones: one round was enough.
    assert outcome.events and outcome.events[0].finished


def test_the_mixed_batch_reserve_and_the_kv_column_see_only_uncached_work() -> None:
    sched = Scheduler(
        make_args(1, "none", enable_prefix_caching=True, enable_mixed_prefill_decode=True)
    )
    ex = ContentExecutor(sched)
    sched.add_request(Request("a", [*SYSTEM, 1], SamplingParams(max_tokens=1)))
    for _ in range(2):
        plan = sched.plan(ALLOW_ALL)
        sched.update(plan, ex.execute(plan))
    assert READERS["kv_permille"](sched, 0.0) == 0  # cached, unheld
    sched.add_request(Request("b", [*SYSTEM, 5, 6], SamplingParams(max_tokens=1)))
    assert sched.planner.pending_prefill_tokens() == 2
    assert sched.probe().wants_prefill


def test_cached_pages_nobody_holds_do_not_count_against_the_watermark() -> None:
    sched = Scheduler(make_args(1, "none", enable_prefix_caching=True, num_kv_pages=7))
    ex = ContentExecutor(sched)
    sched.add_request(Request("a", [7] * 23, SamplingParams(max_tokens=2)))
    while sched.has_unfinished:
        plan = sched.plan(ALLOW_ALL)
        sched.update(plan, ex.execute(plan))
    assert (sched.pool.num_cached_pages, sched.pool.num_used_pages) == (6, 0)
    assert sched.pool.allocate("ballast", 4) == [6]  # the one page never used
    # Counted as used, the cached pages would put the pool at 7/7, over the watermark.
    assert sched.pool.occupancy == 1 / 7
    sched.add_request(Request("b", [8] * 5, SamplingParams(max_tokens=1)))
    assert sched.probe().wants_prefill and sched.can_admit
    plan = sched.plan(ALLOW_ALL)
    assert [(c.start, c.num_tokens) for c in plan.chunks] == [(0, 5)]
    assert sched.pool.num_evictions == 2  # the least recently used cached pages
