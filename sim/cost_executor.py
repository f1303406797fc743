"""An executor that runs no model: it prices the plan with ``RoundCosts`` (the simulator's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from roundgate.actors.control.config import SchedulerConfig
from roundgate.actors.control.rank_loop import RankLoop
from roundgate.actors.control.round import RoundPlan, RoundResult
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.rows import RankRow, RoundView
from roundgate.sim.round_costs import RoundCosts

# The token every simulated sample returns; simulated requests stop on max_tokens only.
SIM_TOKEN = 0


class CostExecutor:
    """Returns a fixed token for every sampling chunk and the rank's priced forward time."""

    def __init__(self, costs: RoundCosts) -> None:
        self.costs = costs

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow], view: RoundView) -> RoundResult:
        if not plan.chunks:
            return RoundResult()  # an idle forward: no samples, and it costs nothing of its own
        # ``chunk.samples`` inlined (a chunk samples iff it reaches the request's last token):
        # asked of every scheduled request of every rank-round.
        sampled = {
            req.request_id: SIM_TOKEN
            for req, start, num_tokens, _ in plan.chunks
            if start + num_tokens >= req.num_prompt_tokens + len(req.output_token_ids)
        }
        size, extends, prefill_tokens, _ = plan.counts()
        costs = self.costs
        kv_tokens = 0
        if costs.decode_per_kv_token_ms:
            # A decode at position ``start`` attends over ``start`` cached tokens.
            kv_tokens = sum(c[1] for c in plan.chunks if not c[3])
        cost_ms = costs.rank_ms(size - extends, prefill_tokens, kv_tokens)
        return RoundResult(sampled, cost_ms / 1000.0)


def cost_loops(args: ServerArgs, costs: RoundCosts, clock: Callable[[], float]) -> list[RankLoop]:
    """A group's rank loops on the cost model: the real schedulers and gate policies, rounds
    priced by ``costs`` and timed by ``clock``. No model behind them: only each rank's pool
    bounds a sequence."""
    return [
        RankLoop(
            Scheduler(SchedulerConfig.from_args(args).replace(max_model_len=None)),
            args.build_policy(rank),
            CostExecutor(costs),
            args.dp_size,
            clock=clock,
        )
        for rank in range(args.dp_size)
    ]
