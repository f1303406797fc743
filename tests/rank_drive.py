"""Jobs driven round by round through real RankLoops (begin/finish), every round checked."""

from __future__ import annotations

from dataclasses import dataclass, field

from builders import make_args, make_loops, make_request

from roundgate.actors.control.rank_loop import RankLoop, RoundOutcome
from roundgate.actors.control.request import Request
from roundgate.actors.control.round import RoundKind
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.local_interval import LocalIntervalConfig


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
    delay, local = args.prefill_delay, args.policy_config_as(LocalIntervalConfig)
    window = (delay.any_interval if delay else 0) + (local.interval if local else 0) + 2
    work = sum((j.prompt_len + 1) * window + j.max_tokens + (j.load_rounds or 0) for j in jobs)
    return 4 * work + 200


def check_round(run: Run, outcomes: list[RoundOutcome]) -> None:
    """Invariants of every round on every rank."""
    for loop, outcome in zip(run.loops, outcomes, strict=True):
        sched, plan = loop.scheduler, outcome.plan
        sched.pool.check_integrity()
        # Exactly the running requests own pages; waiting and retracted hold none.
        owned = sum(len(sched.pool.pages_of(r.request_id)) for r in sched.queues.running)
        assert owned == sched.pool.num_used_pages
        for req in [*sched.queues.waiting, *sched.queues.retracted]:
            assert sched.pool.pages_of(req.request_id) == []
        for req in sched.queues.running:
            assert sched.pool.pages_of(req.request_id) == req.page_ids
            assert req.num_computed_tokens <= len(req.page_ids) * sched.pool.page_size
        assert len(sched.queues.running) <= sched.max_batch_size
        assert plan.num_tokens <= sched.config.max_scheduled_tokens
        permission = outcome.plan.permission
        if not (permission.allow_new or permission.allow_chunks):
            assert plan.num_extends == 0, "prefill planned without permission"
        if not sched.config.enable_mixed_prefill_decode:
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
