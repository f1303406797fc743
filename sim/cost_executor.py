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
from roundgate.sim.speculation import SIM_DRAFT, Acceptance, SimDrafts, SpecSim

# The token every simulated sample returns; simulated requests stop on max_tokens only.
SIM_TOKEN = 0


class CostExecutor:
    """Returns a fixed token for every sampling chunk and the rank's priced forward time;
    with ``acceptance``, keeps a seeded share of each verify chunk's drafts
    (``roundgate.sim.speculation``)."""

    def __init__(self, costs: RoundCosts, acceptance: Acceptance | None = None) -> None:
        self.costs = costs
        self.acceptance = acceptance

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
        if self.acceptance is None:
            cost_ms = costs.rank_ms(size - extends, prefill_tokens, kv_tokens)
            return RoundResult(sampled, cost_ms / 1000.0)
        return self._verify(plan, sampled, prefill_tokens, kv_tokens)

    def _verify(
        self, plan: RoundPlan, sampled: dict[str, int], prefill_tokens: int, kv_tokens: int
    ) -> RoundResult:
        """A round whose decodes carry drafts: each decode token fed is priced as a decode,
        plus the draft steps' share of the decode forward; kept drafts drawn per chunk."""
        acceptance = self.acceptance
        accepted: dict[str, tuple[int, ...]] = {}
        decode_tokens = 0
        steps = 0
        for req, start, num_tokens, is_prefill in plan.chunks:
            if is_prefill:
                continue
            decode_tokens += num_tokens
            drafts = len(req.drafts)
            steps = max(steps, drafts)
            kept = acceptance.kept(drafts) if drafts else 0
            if kept:
                accepted[req.request_id] = (SIM_DRAFT,) * kept
            if self.costs.decode_per_kv_token_ms:
                kv_tokens += start * (num_tokens - 1)  # each draft attends over the context
        costs = self.costs
        cost_ms = costs.rank_ms(decode_tokens, prefill_tokens, kv_tokens)
        if steps and acceptance.spec.draft_share:
            decodes = sum(1 for c in plan.chunks if not c[3])
            cost_ms += steps * acceptance.spec.draft_share * costs.rank_ms(decodes, 0, 0)
        result = RoundResult(sampled, cost_ms / 1000.0)
        result.accepted = accepted
        return result


def cost_loops(
    args: ServerArgs,
    costs: RoundCosts,
    clock: Callable[[], float],
    speculation: SpecSim | None = None,
    seed: int = 0,
) -> list[RankLoop]:
    """A group's rank loops on the cost model: the real schedulers and gate policies, rounds
    priced by ``costs`` and timed by ``clock``. No model behind them: only each rank's pool
    bounds a sequence. With ``speculation``, every decode carries drafts, kept at its rate
    (each rank its own seeded draws)."""
    config = SchedulerConfig.from_args(args).replace(max_model_len=None)
    if speculation is not None:
        config = config.replace(speculative=speculation.config)
    loops = []
    for rank in range(args.dp_size):
        scheduler = Scheduler(config)
        acceptance = None
        if speculation is not None:
            scheduler.planner.speculator = SimDrafts(speculation.config, None, backoff=False)
            acceptance = Acceptance(speculation, seed * 1_000_003 + rank)
        executor = CostExecutor(costs, acceptance)
        loops.append(
            RankLoop(scheduler, args.build_policy(rank), executor, args.dp_size, clock=clock)
        )
    return loops
