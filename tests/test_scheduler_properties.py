"""Property tests: random workloads through RankLoops (real scheduler, policy and cost executor)
driven in-process with begin()/finish(), as the group simulator drives them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from builders import make_args, make_loops, make_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.control.rank_loop import RankLoop, RoundOutcome
from actors.control.request import Request, RequestStatus
from actors.control.round import RoundKind
from actors.control.scheduler import PREFILL_WATERMARK
from actors.server_args import ServerArgs

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- workloads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One request of a workload, in rounds of the group (0-based, before that round's plan)."""

    arrival: int
    rank: int
    prompt_len: int
    max_tokens: int
    abort_at: int | None = None  # round at which the client cancels it
    load_rounds: int | None = None  # arrives LOADING, schedulable this many rounds later


@dataclass
class Run:
    """What a drive produced, for the properties to check."""

    loops: list[RankLoop]
    requests: dict[str, tuple[int, Request]] = field(default_factory=dict)  # id -> (rank, req)
    outcomes: list[list[RoundOutcome]] = field(default_factory=list)  # per round, per rank
    rounds_after_load: int = 0
    max_occupancy: float = 0.0  # highest pool occupancy right after a plan, any rank


POLICIES = ("roundgate", "none", "local-interval")


def policy_args(
    dp_size: int,
    policy: str,
    attempt: int = 1,
    any_: int = 1,
    local_interval: int = 1,
    **overrides,
) -> ServerArgs:
    """``policy`` with its intervals: the gate's (``attempt``/``any_``) or the local one."""
    flags = {
        "roundgate": {"prefill_attempt_interval": attempt, "prefill_any_attempt_interval": any_},
        "local-interval": {"prefill_decode_interval": local_interval},
        "none": {},
    }[policy]
    return make_args(dp_size, policy, **flags, **overrides)


def round_bound(args: ServerArgs, jobs: list[Job]) -> int:
    """A generous round budget for draining ``jobs`` after the last arrival.

    Serialised worst case: every prompt token its own chunk, each chunk waiting a full gate
    window, then every output token its own round. A livelock blows through it.
    """
    window = (args.prefill_any_attempt_interval or 0) + (args.prefill_decode_interval or 0) + 2
    work = sum((j.prompt_len + 1) * window + j.max_tokens + (j.load_rounds or 0) for j in jobs)
    return 4 * work + 200


def check_round(run: Run, outcomes: list[RoundOutcome]) -> None:
    """Invariants of every round on every rank."""
    for loop, outcome in zip(run.loops, outcomes, strict=True):
        sched, plan = loop.scheduler, outcome.plan
        sched.pool.check_integrity()
        # Exactly the running requests own pages; waiting and retracted hold none.
        owned = sum(len(sched.pool.pages_of(r.request_id)) for r in sched.running)
        assert owned == sched.pool.num_used_pages
        for req in [*sched.waiting, *sched.retracted]:
            assert sched.pool.pages_of(req.request_id) == []
        for req in sched.running:
            assert sched.pool.pages_of(req.request_id) == req.page_ids
            assert req.num_computed_tokens <= len(req.page_ids) * sched.pool.page_size
        assert len(sched.running) <= sched.max_batch_size
        assert plan.num_tokens <= sched.args.max_scheduled_tokens
        permission = outcome.plan.permission
        if not (permission.allow_new or permission.allow_chunks):
            assert plan.num_extends == 0, "prefill planned without permission"
        if not sched.args.enable_mixed_prefill_decode:
            assert plan.kind is not RoundKind.MIXED
        assert outcome.rows == outcomes[0].rows


def drive(args: ServerArgs, jobs: list[Job]) -> Run:
    """Run ``jobs`` round by round until every request is done (or the bound is hit)."""
    run = Run(make_loops(args))
    by_round: dict[int, list[tuple[str, Job]]] = {}
    for i, job in enumerate(jobs):
        by_round.setdefault(job.arrival, []).append((f"j{i}", job))
    last_arrival = max((j.arrival for j in jobs), default=0)
    bound = last_arrival + round_bound(args, jobs)
    for rnd in range(bound + 1):
        for rid, job in by_round.get(rnd, []):
            req = make_request(rid, job.prompt_len, job.max_tokens, token=1)
            run.loops[job.rank].scheduler.add_request(req, loading=job.load_rounds is not None)
            run.requests[rid] = (job.rank, req)
        for rid, (rank, _) in run.requests.items():
            job = jobs[int(rid[1:])]
            if job.load_rounds is not None and rnd == job.arrival + job.load_rounds:
                run.loops[rank].scheduler.mark_loaded(rid)
            if job.abort_at is not None and rnd == job.abort_at:
                run.loops[rank].scheduler.abort(rid)
        if rnd > last_arrival:
            if not any(loop.scheduler.has_unfinished for loop in run.loops):
                break
            run.rounds_after_load += 1
        rows = [loop.begin() for loop in run.loops]
        occupancy = max(loop.scheduler.pool.occupancy for loop in run.loops)
        run.max_occupancy = max(run.max_occupancy, occupancy)
        outcomes = [loop.finish(rows) for loop in run.loops]
        check_round(run, outcomes)
        run.outcomes.append(outcomes)
    return run


# --- strategies -------------------------------------------------------------------------------


@st.composite
def configs(draw, policies=POLICIES) -> ServerArgs:
    dp_size = draw(st.integers(1, 3))
    policy = draw(st.sampled_from(policies))
    attempt = draw(st.integers(1, 3))
    return policy_args(
        dp_size,
        policy,
        attempt=attempt,
        any_=draw(st.integers(attempt, 6)),
        local_interval=draw(st.integers(1, 3)),
        max_num_seqs=dp_size * draw(st.integers(1, 4)),
        max_scheduled_tokens=draw(st.integers(1, 16)),
        page_size=draw(st.integers(1, 4)),
        num_kv_pages=draw(st.integers(4, 24)),
        enable_mixed_prefill_decode=draw(st.booleans()),
    )


@st.composite
def workloads(draw, args: ServerArgs, max_jobs: int = 10, with_aborts: bool = True) -> list[Job]:
    """Jobs that every rank accepts (prompt + 1 token fits the pool), some aborted or loading."""
    capacity = args.num_kv_pages * args.page_size
    jobs = []
    for _ in range(draw(st.integers(0, max_jobs))):
        arrival = draw(st.integers(0, 20))
        abort = draw(st.none() | st.integers(0, 30)) if with_aborts else None
        jobs.append(
            Job(
                arrival=arrival,
                rank=draw(st.integers(0, args.dp_size - 1)),
                prompt_len=draw(st.integers(1, capacity - 1)),
                max_tokens=draw(st.integers(1, 12)),
                abort_at=None if abort is None else arrival + abort,
                load_rounds=draw(st.none() | st.integers(0, 4)),
            )
        )
    return jobs


@st.composite
def config_and_workload(draw, policies=POLICIES):
    args = draw(configs(policies))
    return args, draw(workloads(args))


# --- properties -------------------------------------------------------------------------------


@SETTINGS
@given(case=config_and_workload())
def test_pool_integrity_every_round_and_no_leak_or_starvation(case) -> None:
    """Every round keeps every pool consistent (checked inside ``drive``); once arrivals stop,
    every request finishes within a bounded number of rounds (no starvation or livelock),
    and the pools end empty (no page leaked by finishes, aborts or retractions)."""
    args, jobs = case
    run = drive(args, jobs)
    unfinished = [rid for rid, (_, req) in run.requests.items() if not req.is_finished]
    assert not unfinished, f"starved after {run.rounds_after_load} rounds: {unfinished}"
    for loop in run.loops:
        sched = loop.scheduler
        assert sched.pool.num_used_pages == 0, "pages leaked"
        assert not (sched.waiting or sched.running or sched.retracted or sched.requests)
        assert not sched.has_unfinished
    capacity = args.num_kv_pages * args.page_size
    for rid, (_, req) in run.requests.items():
        job = jobs[int(rid[1:])]
        if req.status is RequestStatus.FINISHED_ABORTED:
            assert job.abort_at is not None
            continue
        # The cost executor samples token 0 and sets no stop ids: only the length stops it.
        assert req.status is RequestStatus.FINISHED_LENGTH
        assert req.num_output_tokens == job.max_tokens or req.num_tokens == capacity


@SETTINGS
@given(case=config_and_workload(policies=("roundgate", "none")))
def test_every_rank_reaches_the_same_vote_each_round(case) -> None:
    """The vote is a function of gathered rows only, so every rank agrees every round; a closed
    vote means no rank extends that round."""
    args, jobs = case
    run = drive(args, jobs)
    for outcomes in run.outcomes:
        votes = {o.vote for o in outcomes}
        assert len(votes) == 1, votes
        if not outcomes[0].vote.open:
            assert all(o.plan.num_extends == 0 for o in outcomes)


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
    bound = args.prefill_any_attempt_interval + 1
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
