"""An executor that runs no model: it prices the plan with ``RoundCosts`` (the simulator's)."""

from __future__ import annotations

from collections.abc import Sequence

from actors.round import RoundPlan, RoundResult
from gate import RankRow
from gate.round_costs import RoundCosts

# The token every simulated sample returns; simulated requests stop on max_tokens only.
SIM_TOKEN = 0


class CostExecutor:
    """Returns a fixed token for every sampling chunk and the rank's priced forward time."""

    def __init__(self, costs: RoundCosts) -> None:
        self.costs = costs

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow]) -> RoundResult:
        decodes = prefill_tokens = 0
        sampled: dict[str, int] = {}
        for chunk in plan.chunks:
            if chunk.is_prefill:
                prefill_tokens += chunk.num_tokens
            else:
                decodes += 1
            if chunk.samples:
                sampled[chunk.request.request_id] = SIM_TOKEN
        return RoundResult(sampled, self.costs.rank_ms(decodes, prefill_tokens) / 1000.0)
