"""EngineCore: thread-safe intake, timed round parts, and parked KV released on abort."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from builders import make_args, make_request

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.request import RequestStatus
from roundgate.actors.control.round import RoundPlan, RoundResult
from roundgate.gate.rows import RankRow, RoundView
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY


class ParkingExecutor(CostExecutor):
    def __init__(self) -> None:
        super().__init__(TOY)
        self.dropped: list[str] = []

    def drop_parked(self, request_id: str) -> None:
        self.dropped.append(request_id)


class CountingExecutor(CostExecutor):
    """The cost executor, counting the forwards it is asked to run."""

    def __init__(self) -> None:
        super().__init__(TOY)
        self.calls = 0

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow], view: RoundView) -> RoundResult:
        self.calls += 1
        return super().execute(plan, rows, view)


def test_aborting_a_retracted_request_releases_its_parked_kv() -> None:
    executor = ParkingExecutor()
    core = EngineCore(make_args(1, "none", num_kv_pages=4), executor)
    for rid in ("a", "b"):
        core.submit(make_request(rid, prompt_len=6, max_tokens=12))
    for _ in range(40):
        core.step()
        retracted = list(core.scheduler.queues.retracted)
        if retracted:
            break
    assert retracted, "the pool never came under pressure"
    victim = retracted[0]
    core.abort(victim.request_id)
    core.step()
    assert victim.status is RequestStatus.FINISHED_ABORTED
    assert executor.dropped == [victim.request_id]
    core.scheduler.pool.check_integrity()


def test_round_parts_are_timed_and_intake_is_counted() -> None:
    executor = CountingExecutor()
    core = EngineCore(make_args(1, "none"), executor)
    core.submit(make_request("x", prompt_len=3, max_tokens=2))
    assert core.num_unfinished == 1  # queued for the next round, not yet in the scheduler
    assert not core.scheduler.queues.requests
    outcome = core.step()
    parts = core.loop.parts
    assert set(parts.as_dict()) == {"schedule", "gather", "forward", "finish"}
    # The forward part is what the executor reported (simulated seconds here), not a timing.
    assert outcome.plan.num_extends == 1 and outcome.result.cost_s > 0
    assert parts.forward == outcome.result.cost_s
    assert parts.total == pytest.approx(sum(parts.as_dict().values()))
    assert parts.total > 0
    assert executor.calls == 1


def test_an_idle_groups_round_runs_no_forward() -> None:
    executor = CountingExecutor()
    core = EngineCore(make_args(1, "none"), executor)
    core.submit(make_request("x", prompt_len=3, max_tokens=2))
    busy = [core.step() for _ in range(2)]  # the prefill, then the last decode
    assert [o.view.busy for o in busy] == [True, True] and core.num_unfinished == 0
    assert executor.calls == 2 and core.loop.parts.forward > 0
    outcome = core.step()
    assert outcome.view.all_idle
    assert outcome.result == RoundResult()
    assert executor.calls == 2  # no forward was run
    assert core.loop.parts.forward == 0.0  # and none is reported


def test_submit_refuses_a_prompt_that_can_never_fit() -> None:
    core = EngineCore(make_args(1, "none", max_model_len=8), CountingExecutor())
    # prompt + 1 generated token must fit the context length (8) and the pool (32 x 4).
    with pytest.raises(ValueError, match="context length 8"):
        core.submit(make_request("long", prompt_len=8))
    assert core.num_unfinished == 0
    core.submit(make_request("fits", prompt_len=7))
    assert core.num_unfinished == 1
    pool_bound = EngineCore(make_args(1, "none", num_kv_pages=2), CountingExecutor())
    with pytest.raises(ValueError, match="KV pages"):
        pool_bound.submit(make_request("big", prompt_len=8))
    assert pool_bound.num_unfinished == 0
