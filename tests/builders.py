"""Shared builders for the unit tests: engine args, requests, schedulers, rank loops, rows.

One definition each, so a test reads as its table of cases. The defaults are a small group
(pages of 4 tokens, a 16-token round budget) in which every scheduling effect shows up within
a few rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roundgate.actors.control.gather import ThreadGather
from roundgate.actors.control.rank_loop import RankLoop, RoundOutcome
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.rows import RankRow
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY

# The gate's intervals the small-group tests run with.
GATE = {"prefill_attempt_interval": 2, "prefill_any_attempt_interval": 4}
# Each policy's own flags in those tests (the rest keep their defaults).
POLICY_FLAGS: dict[str, dict[str, Any]] = {
    "roundgate": GATE,
    "none": {},
    "local-interval": {"prefill_decode_interval": 2},
    "sglang-delayer": {},
    "vllm-interval": {"prefill_schedule_interval": 2},
    "trtllm-balance": {},
}


def make_args(dp_size: int = 2, policy: str | None = "roundgate", **overrides: Any) -> ServerArgs:
    """A small group's args; ``policy`` None leaves the policy to the flags in ``overrides``."""
    values: dict[str, Any] = {
        "dp_size": dp_size,
        "max_num_seqs": 4 * dp_size,
        "max_scheduled_tokens": 16,
        "page_size": 4,
        "num_kv_pages": 32,
        # The prompts here repeat one token, so with caching on every later prompt would hit;
        # the prefix-cache tests turn it on themselves.
        "enable_prefix_caching": False,
    }
    if policy is not None:
        values |= {"prefill_policy": policy, **POLICY_FLAGS.get(policy, {})}
    return ServerArgs(**(values | overrides))


def make_request(
    request_id: str, prompt_len: int = 4, max_tokens: int = 4, token: int = 3, **sampling: Any
) -> Request:
    """A request whose prompt is ``prompt_len`` copies of ``token``."""
    return Request(
        request_id, [token] * prompt_len, SamplingParams(max_tokens=max_tokens, **sampling)
    )


def make_scheduler(args: ServerArgs | None = None, **overrides: Any) -> Scheduler:
    return Scheduler(args or make_args(dp_size=1, policy="none", **overrides))


def make_loops(
    args: ServerArgs,
    executors: Sequence[Any] | None = None,
    gather: ThreadGather | None = None,
) -> list[RankLoop]:
    """One ``RankLoop`` per rank over the cost executor (or ``executors``), clock at 0."""
    return [
        RankLoop(
            Scheduler(args),
            args.build_policy(rank),
            executors[rank] if executors else CostExecutor(TOY),
            args.dp_size,
            gather.for_rank(rank) if gather is not None else None,
            clock=lambda: 0.0,
        )
        for rank in range(args.dp_size)
    ]


def drive_round(loops: Sequence[RankLoop]) -> list[RoundOutcome]:
    """The in-process driver of the simulator: every rank's begin, then every rank's finish."""
    rows = [loop.begin() for loop in loops]
    return [loop.finish(rows) for loop in loops]


def row(
    want: bool = False,
    decodes: bool = True,
    extends: int = 0,
    batch: int | None = None,
    tokens: int | None = None,
    extras: tuple[int, ...] = (),
) -> RankRow:
    """One rank's gathered row; by default a rank decoding 4 sequences with no backlog."""
    if batch is None:
        batch = (4 if decodes else 0) + extends
    if tokens is None:
        tokens = (4 if decodes else 0) + 100 * extends
    return RankRow(tokens, batch, extends, want, decodes, extras)
