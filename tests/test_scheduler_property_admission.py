"""Admission-bound properties of the gate: within any_interval + 1 rounds, the ANY cadence."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_drive import Job, drive, policy_args

from roundgate.actors.control.scheduler import PREFILL_WATERMARK


@st.composite
def unpressured_gate_workloads(draw):
    """Gate on; pools, batches and budgets large enough that no rank ever nears the watermark,
    fills its batch or has to queue a prompt behind another prompt's tokens."""
    dp_size = draw(st.integers(1, 3))
    attempt = draw(st.integers(1, 4))
    args = policy_args(
        dp_size,
        "roundgate",
        attempt=attempt,
        any_=draw(st.integers(attempt, 8)),
        max_num_seqs=dp_size * 16,
        max_scheduled_tokens=64,
        page_size=4,
        num_kv_pages=256,
        enable_mixed_prefill_decode=draw(st.booleans()),
    )
    jobs = [
        Job(
            arrival=draw(st.integers(0, 60)),
            rank=rank,
            prompt_len=draw(st.integers(1, 8)),
            max_tokens=draw(st.integers(1, 30)),
        )
        for rank in range(dp_size)
        for _ in range(draw(st.integers(0, 6)))
    ]
    return args, jobs


@settings(max_examples=100, deadline=None)
@given(case=unpressured_gate_workloads())
def test_gate_admits_within_any_interval_plus_one(case) -> None:
    """Admission bound of the group gate.

    What the invariant guarantees: a prompt first published as a want in round W (its rank's
    row carries want=True) is prefilled by round W + any_interval + 1, *provided* that while it
    waits its rank stays at or below the watermark (so it keeps publishing the want and its
    fresh plan-time probe agrees), has a free batch slot, and the prompt is not queued behind
    other local work that uses up the round's token budget (resident chunks, earlier prompts
    FIFO, or decodes in a mixed batch). Reason: the counter after round W is at worst 0, so at
    the latest the vote of round W + any_interval + 1 is an ANY point, and it opens because
    the rows of the round before carry this rank's want; any earlier opening admits it too.

    The workloads here satisfy the proviso by construction (256-page pools, 16 slots a rank,
    at most 6 prompts of <= 8 tokens a rank against a 64-token budget), and the test checks
    that no round was excused. It does not claim the bound under KV pressure or a full batch:
    ``admission_wait`` subtracts those rounds, but a window the prompt missed while excused
    can still push its next chance up to another any_interval + 1 rounds later.
    """
    args, jobs = case
    run = drive(args, jobs)
    assert args.prefill_delay is not None
    bound = args.prefill_delay.any_interval + 1
    assert run.max_occupancy <= PREFILL_WATERMARK
    for loop in run.loops:
        assert loop.scheduler.excused_rounds == 0  # never held by pressure or a full batch
    for rid, (rank, req) in run.requests.items():
        assert req.is_finished, rid
        if req.first_want_round is None:
            # Admitted in the round it arrived, before any want was published.
            assert req.first_prefill_round == req.arrival_round + 1
            continue
        wait = run.loops[rank].scheduler.admission_wait(req)
        assert wait is not None and 1 <= wait <= bound, (rid, wait, bound)


@pytest.mark.parametrize(("arrival", "wait"), [(1, 4), (2, 3), (3, 2), (4, 1), (5, 4)])
def test_admission_wait_follows_the_any_cadence(arrival: int, wait: int) -> None:
    """Two ranks decode long outputs (admitted together in round 1, counter reset to 0); a
    prompt then arrives on rank 0 while rank 1 has no backlog, so every ALL point stays closed
    and only ANY points (counter 4, 8, ...) open. Its wait is the distance from its first
    published want to the next ANY vote that sees it: at most ``any_interval`` here, inside the
    ``any_interval + 1`` bound (the bound's extra round is the vote's one round of staleness)."""
    args = policy_args(2, "roundgate", attempt=2, any_=4, max_scheduled_tokens=64, num_kv_pages=256)
    jobs = [Job(0, 0, 4, 60), Job(0, 1, 4, 60), Job(arrival, 0, 4, 5)]
    run = drive(args, jobs)
    rank, late = run.requests["j2"]
    assert late.first_want_round == arrival + 1  # scheduler rounds count from 1
    assert run.loops[rank].scheduler.admission_wait(late) == wait
    opened = [o[0].vote for o in run.outcomes[late.first_want_round : late.first_prefill_round]]
    assert [v.open for v in opened] == [False] * (wait - 1) + [True]
    assert opened[-1].point == "any"
