"""The toy cost model of prefill interference (milliseconds).

An iteration costs ``decode_cost`` per decoding sequence plus ``prefill_cost`` per prefill
token it processes. It is small enough to reason about by hand; the group simulator prices a
rank's forward with ``iteration_time`` (``roundgate.sim.round_costs.RoundCosts.rank_ms``: its
``toy`` preset is exactly this model, the calibrated presets add a fixed and a context-length term).
Pure arithmetic, no clocks. See docs/cost-model.md for the worked examples.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

DECODE_COST_MS = 1.0
PREFILL_COST_MS = 0.1


def iteration_time(
    decodes: int,
    prefill_tokens: int,
    decode_cost: float = DECODE_COST_MS,
    prefill_cost: float = PREFILL_COST_MS,
) -> float:
    """Milliseconds for one iteration with ``decodes`` sequences and ``prefill_tokens`` tokens.

    >>> iteration_time(4, 2000)
    204.0
    """
    if decodes < 0 or prefill_tokens < 0:
        raise ValueError(
            f"decodes and prefill_tokens must be >= 0, got {decodes}, {prefill_tokens}"
        )
    return decodes * decode_cost + prefill_tokens * prefill_cost


def stall_factor(decodes: int, prompt_tokens: int) -> float:
    """How many times longer the running requests wait when the whole prompt joins the round."""
    if decodes < 1:
        raise ValueError(f"stall_factor needs decodes >= 1, got {decodes}")
    return iteration_time(decodes, prompt_tokens) / iteration_time(decodes, 0)


def added_delay(decodes: int, prompt_tokens: int) -> float:
    """Extra milliseconds each running request waits because the prompt shares its round."""
    return iteration_time(decodes, prompt_tokens) - iteration_time(decodes, 0)


def total_prompt_cost(prompts: Iterable[int]) -> float:
    """Milliseconds to prefill every prompt length in ``prompts``."""
    return sum(iteration_time(0, tokens) for tokens in prompts)


def utilization(schedule: Sequence[Sequence[Hashable | None]]) -> float:
    """Busy slot-iterations over available slot-iterations; ``None`` marks an empty slot.

    Assumes every iteration costs the same and ignores prefill, as the worked example does.
    """
    available = sum(len(round_slots) for round_slots in schedule)
    if available == 0:
        raise ValueError("utilization of an empty schedule is undefined")
    busy = sum(slot is not None for round_slots in schedule for slot in round_slots)
    return busy / available
