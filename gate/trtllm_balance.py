"""TensorRT-LLM's attention-DP balance (``attention_dp_config.enable_balance``), re-implemented.

TRT-LLM decides on the batch it is about to run: each rank's ``(n_ctx, n_gen, n_tok)`` of the
scheduled batch. With one gather per round, the rows that can carry those counts are last
round's, published after the plan: ``ctx_requests`` is the number of context requests the rank
would schedule next (resident chunks plus admissible prompts), ``gen_requests`` its decoding
requests, and ``num_tokens`` (a gate column) the planned tokens. The counters advance once per
round from those rows, so every rank agrees; the reaction is one round later than TRT-LLM's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roundgate.gate.policy import RoundByRound
from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.spec import PolicyContext, PolicySpec
from roundgate.gate.vote import GateVote

COLUMNS = ("ctx_requests", "gen_requests")

_RELEASE = GateVote(True, None, reason="release")
_HOLD = GateVote(False, None, reason="hold")


@dataclass(frozen=True)
class TrtllmBalanceConfig:
    """TRT-LLM's knobs with its defaults (flags ``--attention-dp-*``)."""

    timeout_iters: int = field(
        default=50,
        metadata={"help": "trtllm-balance: rounds context requests may wait for every rank"},
    )
    batching_wait_iters: int = field(
        default=10,
        metadata={"help": "trtllm-balance: rounds to gather context when all ranks have some"},
    )

    def __post_init__(self) -> None:
        if self.timeout_iters < 1:
            raise ValueError(f"--attention-dp-timeout-iters must be >= 1, got {self.timeout_iters}")
        if self.batching_wait_iters < 0:
            raise ValueError(
                f"--attention-dp-batching-wait-iters must be >= 0, got {self.batching_wait_iters}"
            )


class TrtllmBalance(RoundByRound):
    """Hold context requests until every rank has some (or a timeout), then batch them."""

    extra_columns: tuple[str, ...] = COLUMNS

    def __init__(self, config: TrtllmBalanceConfig, max_batch_size: int) -> None:
        self.config = config
        self.max_batch_size = max_batch_size  # the per-rank batch limit
        self.wait_cnt = 0
        self.batch_cnt = 0

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        """Release or hold context requests; generation always runs."""
        cfg = self.config
        ctx = [row.extras[0] for row in rows]
        gen = [row.extras[1] for row in rows]
        free = all(g < self.max_batch_size for g in gen)
        all_ctx = all(c > 0 for c in ctx)
        all_gen = all(g > 0 for g in gen)
        release = True
        if free and all_ctx:
            self.wait_cnt = 0
            if all_gen:
                if self.batch_cnt < cfg.batching_wait_iters:
                    self.batch_cnt += 1
                    release = False
                else:
                    self.batch_cnt = 0
        else:
            self.wait_cnt += 1
            release = False
            if self.wait_cnt >= cfg.timeout_iters or not all_gen:
                self.wait_cnt = 0
                release = True
        return _RELEASE if release else _HOLD

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        """The counters move at decision time; nothing to learn after the gather."""
        return None


def _build(config: TrtllmBalanceConfig, ctx: PolicyContext) -> TrtllmBalance:
    return TrtllmBalance(config, ctx.max_batch_size)


POLICY = PolicySpec(
    name="trtllm-balance",
    summary="TensorRT-LLM's attention-DP balance: context/generation counts of all ranks",
    config=TrtllmBalanceConfig,
    build=_build,
    flag_prefix="attention_dp_",
)
