"""A round aborted mid-forward (an elastic MoE group re-formed around a lost member) runs
again from its gather: the executor's re-form hook, the loop's retry, and a runner that runs
the same plan twice making the same tokens."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from builders import make_args, make_request
from model_driver import grow_pages, make_requests, make_runner, next_chunk

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.executor import RoundAborted
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.rank_loop import MAX_ABORTS, RankLoop
from roundgate.actors.control.round import RoundPlan, RoundResult
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.replica.elastic_forward import ElasticForward, lost_peer
from roundgate.gate.rows import RankRow, RoundView
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY


class CountingGather:
    """A group of one that counts its gathers."""

    def __init__(self) -> None:
        self.calls = 0

    def all_gather(self, row: tuple) -> list[tuple]:
        self.calls += 1
        return [row]


class AbortingExecutor:
    """The cost executor, aborting its first ``aborts`` calls as a re-formed group does."""

    def __init__(self, aborts: int) -> None:
        self.inner = CostExecutor(TOY)
        self.aborts = aborts
        self.calls = 0

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow], view: RoundView) -> RoundResult:
        self.calls += 1
        if self.calls <= self.aborts:
            raise RoundAborted("the group re-formed mid-round")
        return self.inner.execute(plan, rows, view)


def one_rank_loop(executor: AbortingExecutor, gather: CountingGather) -> RankLoop:
    args = make_args(dp_size=1)
    loop = RankLoop(Scheduler(args), args.build_policy(0), executor, 1, gather, clock=lambda: 0.0)
    loop.scheduler.add_request(make_request("a", prompt_len=3, max_tokens=4))
    return loop


def test_an_aborted_round_is_gathered_and_run_again_once() -> None:
    executor, gather = AbortingExecutor(aborts=1), CountingGather()
    loop = one_rank_loop(executor, gather)
    outcome = loop.step()
    assert (gather.calls, executor.calls) == (2, 2)  # the row gathered again, run again
    request = loop.scheduler.queues.running[0]
    assert request.num_computed_tokens == 3 and len(request.output_token_ids) == 1
    assert outcome.plan.num_extends == 1


def test_a_round_that_keeps_aborting_fails_the_group() -> None:
    executor, gather = AbortingExecutor(aborts=MAX_ABORTS + 1), CountingGather()
    with pytest.raises(RoundAborted):
        one_rank_loop(executor, gather).step()
    assert executor.calls == MAX_ABORTS + 1


class FailingRunner:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def execute(self, plan, rows, view):
        raise self.error


def test_a_failed_collective_reforms_and_aborts_the_round() -> None:
    reforms: list[str] = []
    forward = ElasticForward(
        FailingRunner(RuntimeError("Connection closed by peer")), lambda: reforms.append("x")
    )  # type: ignore[arg-type]
    with pytest.raises(RoundAborted, match="Connection closed by peer"):
        forward.execute(RoundPlan(), [], None)  # type: ignore[arg-type]
    assert reforms == ["x"]


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad token id"),
        RuntimeError("mat1 and mat2 shapes cannot be multiplied"),  # a bug, not a peer
        torch.OutOfMemoryError("CUDA out of memory"),  # the rank's own failure
    ],
)
def test_the_rank_s_own_errors_are_not_a_lost_member(error: Exception) -> None:
    """A local failure ends this rank as before: re-forming would make every member time
    out and then fail the same round the same way."""
    reforms: list[str] = []
    forward = ElasticForward(FailingRunner(error), lambda: reforms.append("x"))  # type: ignore[arg-type]
    with pytest.raises(type(error)):
        forward.execute(RoundPlan(), [], None)  # type: ignore[arg-type]
    assert reforms == []


@pytest.mark.parametrize(
    "message",
    [
        "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:38025",
        "[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for recv",
    ],
)
def test_gloo_s_words_for_a_lost_peer_are_recognised(message: str) -> None:
    assert lost_peer(RuntimeError(message))


def test_a_runner_runs_the_same_plan_twice_to_the_same_tokens() -> None:
    """What a re-run after an abort relies on: the forward rewrites the round's KV with the
    same values, the one-off steps run once."""
    runner = make_runner("tiny-moe")
    pool = KVPool(PoolConfig(256, 4))
    requests = make_requests([[5, 6, 7, 8], [9, 10]])
    sampled = []
    for _ in range(3):  # a prefill round and two decodes, each run twice
        chunks = [next_chunk(r, chunk_size=1 << 30) for r in requests]
        for chunk in chunks:
            grow_pages(pool, chunk.request, chunk.end)
        plan = RoundPlan(chunks=chunks)
        first = runner.execute(plan).sampled
        again = runner.execute(plan).sampled
        assert first == again
        sampled.append(first)
        for chunk in chunks:
            chunk.request.num_computed_tokens = chunk.end
            chunk.request.append_token(first[chunk.request.request_id])
    reference = make_runner("tiny-moe")
    pool = KVPool(PoolConfig(256, 4))
    requests = make_requests([[5, 6, 7, 8], [9, 10]])
    for expected in sampled:
        chunks = [next_chunk(r, chunk_size=1 << 30) for r in requests]
        for chunk in chunks:
            grow_pages(pool, chunk.request, chunk.end)
        got = reference.execute(RoundPlan(chunks=chunks)).sampled
        assert got == expected
        for chunk in chunks:
            chunk.request.num_computed_tokens = chunk.end
            chunk.request.append_token(got[chunk.request.request_id])
