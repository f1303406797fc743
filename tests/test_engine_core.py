"""EngineCore: thread-safe intake, timed round parts, and parked KV released on abort."""

from __future__ import annotations

from actors.control.engine_core import EngineCore
from actors.control.request import Request, RequestStatus, SamplingParams
from actors.server_args import ServerArgs
from deployment.sim.cost_executor import CostExecutor
from deployment.sim.round_costs import TOY


class ParkingExecutor(CostExecutor):
    def __init__(self) -> None:
        super().__init__(TOY)
        self.dropped: list[str] = []

    def drop_parked(self, request_id: str) -> None:
        self.dropped.append(request_id)


def test_aborting_a_retracted_request_releases_its_parked_kv() -> None:
    executor = ParkingExecutor()
    core = EngineCore(ServerArgs(num_kv_pages=4, page_size=4, max_num_seqs=4), executor)
    for rid in ("a", "b"):
        core.submit(Request(rid, [1] * 6, SamplingParams(max_tokens=12)))
    for _ in range(40):
        core.step()
        retracted = [r for r in core.scheduler.retracted]
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
    core = EngineCore(ServerArgs(), CostExecutor(TOY))
    core.submit(Request("x", [1, 2, 3], SamplingParams(max_tokens=2)))
    assert core.num_unfinished == 1
    core.step()
    assert set(core.last_parts) == {"schedule", "gather", "forward", "finish"}
    assert all(v >= 0 for v in core.last_parts.values())
