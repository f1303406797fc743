"""The per-round loop of one rank (``RankLoop``) and the in-process gathers."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from builders import drive_round, make_args, make_loops, make_request

from roundgate.actors.control.gather import SingleRankGather, ThreadGather
from roundgate.actors.control.rank_loop import RankLoop, RoundOutcome
from roundgate.actors.control.round import RoundPlan, RoundResult
from roundgate.actors.control.scheduler import Scheduler
from roundgate.gate import registry
from roundgate.gate.permission import ALLOW_ALL, HOLD_ALL
from roundgate.gate.rows import RankRow, RoundView, read_rows
from roundgate.gate.vote import GateVote
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY

# --- builders ---------------------------------------------------------------------------------


class SpyExecutor:
    """Records every call, then prices the plan like the cost executor."""

    def __init__(self) -> None:
        self.calls: list[tuple[RoundPlan, list[RankRow], RoundView]] = []
        self._inner = CostExecutor(TOY)

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow], view: RoundView) -> RoundResult:
        self.calls.append((plan, list(rows), view))
        return self._inner.execute(plan, rows, view)


def summary(outcome: RoundOutcome) -> tuple:
    """An outcome as plain data (request objects differ between two runs of one workload).

    Rows are compared packed: ``RankRow`` equality ignores a policy's extra columns, and those
    must travel through the gather unchanged too.
    """
    plan = outcome.plan
    return (
        outcome.vote,
        plan.permission,
        plan.kind,
        [(c.request.request_id, c.start, c.num_tokens, c.is_prefill) for c in plan.chunks],
        [r.request_id for r, _ in plan.retracted],
        [r.request_id for r in plan.readmitted],
        [r.pack() for r in outcome.rows],
        outcome.view,
        sorted(outcome.result.sampled.items()),
        outcome.result.cost_s,
        [(e.request.request_id, e.token_id, e.finished) for e in outcome.events],
    )


# Arrivals: (round, rank, request id, prompt tokens, max tokens). Scattered prompts of mixed
# lengths (some chunked over rounds), with idle stretches and both ranks decoding at times.
ARRIVALS = [
    (0, 0, "a", 5, 6),
    (1, 1, "b", 20, 4),
    (3, 0, "c", 3, 9),
    (4, 1, "d", 40, 3),
    (9, 0, "e", 7, 2),
    (30, 1, "f", 2, 2),
    (31, 0, "g", 12, 5),
]
NUM_ROUNDS = 50


def add_arrivals(loop: RankLoop, rank: int, rnd: int) -> None:
    for when, where, rid, prompt_len, max_tokens in ARRIVALS:
        if when == rnd and where == rank:
            loop.scheduler.add_request(make_request(rid, prompt_len, max_tokens))


# --- ThreadGather vs the in-process driver -----------------------------------------------------


@pytest.mark.parametrize("policy", registry.names())
@pytest.mark.parametrize("mixed", [False, True])
def test_thread_gather_matches_the_in_process_driver(policy: str, mixed: bool) -> None:
    """Every policy, extra columns included, behaves the same whether the rows come from a
    real gather between threads or from the simulator's in-process driver."""
    args = make_args(2, policy, enable_mixed_prefill_decode=mixed)

    loops = make_loops(args)
    expected: list[list[tuple]] = [[], []]
    for rnd in range(NUM_ROUNDS):
        for rank, loop in enumerate(loops):
            add_arrivals(loop, rank, rnd)
        for rank, outcome in enumerate(drive_round(loops)):
            expected[rank].append(summary(outcome))

    gather = ThreadGather(2, timeout=10.0)
    threaded = make_loops(args, gather=gather)
    got: list[list[tuple]] = [[], []]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            for rnd in range(NUM_ROUNDS):
                add_arrivals(threaded[rank], rank, rnd)
                got[rank].append(summary(threaded[rank].step()))
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert got == expected
    # The workload exercises what it should: prefill on both ranks, and a drained group.
    kinds = {str(s[2]) for rank in expected for s in rank}
    assert {"prefill", "decode", "idle"} <= kinds
    assert all(any(c[3] for s in rank for c in s[3]) for rank in expected)
    assert not any(loop.scheduler.has_unfinished for loop in threaded)
    # A policy with extra columns publishes them in every row of the gather.
    width = 5 + len(threaded[0].policy.extra_columns)
    assert all(len(packed) == width for rank in got for s in rank for packed in s[6])


def test_thread_gather_returns_rows_in_rank_order_each_round() -> None:
    gather = ThreadGather(3, timeout=10.0)
    results: dict[int, list[list[tuple[int, ...]]]] = {r: [] for r in range(3)}

    def rank_main(rank: int) -> None:
        handle = gather.for_rank(rank)
        for rnd in range(20):
            results[rank].append(handle.all_gather((rank, rnd)))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for rank in range(3):
        assert results[rank] == [[(0, rnd), (1, rnd), (2, rnd)] for rnd in range(20)]


def test_thread_gather_missing_rank_is_an_error_not_a_hang() -> None:
    gather = ThreadGather(2, timeout=0.2)
    with pytest.raises(threading.BrokenBarrierError):
        gather.for_rank(0).all_gather((1, 2, 3))


@pytest.mark.parametrize("rank", [-1, 2])
def test_thread_gather_refuses_ranks_outside_the_group(rank: int) -> None:
    with pytest.raises(ValueError, match="outside a group of 2"):
        ThreadGather(2).for_rank(rank)


def test_single_rank_gather_and_step() -> None:
    args = make_args(1)
    loop = RankLoop(Scheduler(args), args.build_policy(0), CostExecutor(TOY), 1, SingleRankGather())
    loop.scheduler.add_request(make_request("solo", 4, 2))
    outcomes = [loop.step() for _ in range(3)]
    assert [o.plan.kind for o in outcomes] == ["prefill", "decode", "idle"]
    assert SingleRankGather().all_gather((1, 2)) == [(1, 2)]


# --- the order of one round ----------------------------------------------------------------------


def test_round_zero_is_an_all_point_that_opens_for_an_idle_group() -> None:
    loops = make_loops(make_args(2))
    loops[1].scheduler.add_request(make_request("first", 6, 3))
    outcomes = drive_round(loops)
    assert [o.vote for o in outcomes] == [GateVote(True, "all")] * 2
    # Permission is the vote *and* the fresh local want: rank 0 has nothing to prefill.
    assert [o.plan.permission for o in outcomes] == [HOLD_ALL, ALLOW_ALL]
    assert [o.plan.num_extends for o in outcomes] == [0, 1]


def test_vote_uses_last_rounds_rows_and_plan_uses_a_fresh_probe() -> None:
    loops = make_loops(make_args(2))
    loops[0].scheduler.add_request(make_request("long", 4, 30))
    loops[1].scheduler.add_request(make_request("long1", 4, 30))
    drive_round(loops)  # both admitted at the opening ALL point; counter back to 0
    # A prompt arriving now is seen by the vote only after it has been published once.
    loops[0].scheduler.add_request(make_request("late", 4, 2))
    outcome = drive_round(loops)[0]
    assert outcome.vote == GateVote(False, "all")  # rank 1 decodes and wants nothing
    assert outcome.rows[0].wants_prefill and not outcome.rows[1].wants_prefill
    assert outcome.plan.num_extends == 0


def test_all_idle_rounds_run_no_forward() -> None:
    spies = [SpyExecutor(), SpyExecutor()]
    loops = make_loops(make_args(2), executors=spies)
    for _ in range(3):
        outcomes = drive_round(loops)
        assert all(o.view.all_idle for o in outcomes)
        assert all(o.result == RoundResult() for o in outcomes)
    assert spies[0].calls == [] and spies[1].calls == []


def test_an_idle_rank_joins_the_forward_while_a_peer_works() -> None:
    spies = [SpyExecutor(), SpyExecutor()]
    loops = make_loops(make_args(2), executors=spies)
    loops[0].scheduler.add_request(make_request("only", 4, 2))
    rounds = [drive_round(loops) for _ in range(4)]
    busy = [r for r in rounds if r[0].view.busy]
    assert len(busy) == 2  # the prefill round and one decode round
    for spy in spies:
        assert len(spy.calls) == 2
    # Rank 1's calls are idle forwards: an empty plan, but the group's rows.
    for plan, rows, _ in spies[1].calls:
        assert plan.batch_size == 0 and rows[0].batch_size > 0
    assert spies[1].calls[0][1] == list(rounds[0][0].rows)
    # Every rank's executor gets the round's one reading: the prefill round runs the normal
    # MoE legs everywhere, the decode round the low-latency ones.
    for spy in spies:
        assert [view.low_latency for _, _, view in spy.calls] == [False, True]
        assert all(view == read_rows(rows) for _, rows, view in spy.calls)


def test_observe_resets_the_counter_from_the_gathered_rows() -> None:
    loops = make_loops(make_args(2))
    loops[0].scheduler.add_request(make_request("x", 4, 6))
    counters = []
    for _ in range(4):
        drive_round(loops)
        counters.append([loop.policy.rounds_since_prefill for loop in loops])
    # Prefill in round 1 resets to 0, decode rounds count up; every rank holds the same counter.
    assert counters == [[0, 0], [1, 1], [2, 2], [3, 3]]


def test_finish_without_begin_and_step_without_gather_are_errors() -> None:
    (loop,) = make_loops(make_args(1, policy="none"))
    with pytest.raises(RuntimeError, match="without begin"):
        loop.finish([RankRow(0, 0, 0, False, False)])
    with pytest.raises(RuntimeError, match="needs a gather"):
        loop.step()
