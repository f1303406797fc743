"""Properties on random workloads and configs: pool integrity, no leak or starvation, one vote."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rank_drive import Job, drive, policy_args

from roundgate.actors.control.request import RequestStatus
from roundgate.actors.server_args import ServerArgs

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

POLICIES = ("roundgate", "none", "local-interval")


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
        assert not (
            sched.queues.waiting
            or sched.queues.running
            or sched.queues.retracted
            or sched.queues.requests
        )
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
