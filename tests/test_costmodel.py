"""The toy cost model: the worked numbers of docs/cost-model.md, and the simulator's ``toy``
preset pricing rounds with it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roundgate.gate.costmodel import (
    added_delay,
    iteration_time,
    stall_factor,
    total_prompt_cost,
    utilization,
)
from roundgate.sim.round_costs import PRESETS

# Two slots serving A, B, C with output lengths 2, 1, 2 (docs/cost-model.md).
STATIC = [["A", "B"], ["A", None], ["C", None], ["C", None]]
CONTINUOUS = [["A", "B"], ["A", "C"], ["C", None]]


@pytest.mark.parametrize(
    ("decodes", "prefill_tokens", "expected_ms"),
    [
        (4, 0, 4.0),  # four sequences decoding
        (4, 2000, 204.0),  # the same round with a whole 2000-token prompt
        (0, 2000, 200.0),
        (0, 0, 0.0),
        (128, 0, 128.0),
        (4, 512, 55.2),  # one 512-token chunk instead of the whole prompt
    ],
)
def test_iteration_time(decodes: int, prefill_tokens: int, expected_ms: float) -> None:
    assert iteration_time(decodes, prefill_tokens) == pytest.approx(expected_ms)


def test_iteration_time_custom_costs() -> None:
    assert iteration_time(8, 1000, decode_cost=0.25, prefill_cost=0.15) == pytest.approx(152.0)


@pytest.mark.parametrize(("decodes", "prefill_tokens"), [(-1, 0), (0, -1)])
def test_iteration_time_refuses_negative_work(decodes: int, prefill_tokens: int) -> None:
    with pytest.raises(ValueError):
        iteration_time(decodes, prefill_tokens)


@pytest.mark.parametrize(
    ("decodes", "prompt_tokens", "factor", "delay_ms"),
    [
        (4, 2000, 51.0, 200.0),  # 204 ms instead of 4 ms
        (4, 0, 1.0, 0.0),
        (1, 10, 2.0, 1.0),
        (100, 2000, 3.0, 200.0),  # the added delay does not depend on the batch
    ],
)
def test_stall_factor_and_added_delay(
    decodes: int, prompt_tokens: int, factor: float, delay_ms: float
) -> None:
    assert stall_factor(decodes, prompt_tokens) == pytest.approx(factor)
    assert added_delay(decodes, prompt_tokens) == pytest.approx(delay_ms)


@pytest.mark.parametrize("decodes", [0, -1])
def test_stall_factor_needs_a_decode(decodes: int) -> None:
    with pytest.raises(ValueError, match="decodes"):
        stall_factor(decodes, 2000)


@given(decodes=st.integers(1, 512), prompt_tokens=st.integers(0, 1 << 16))
def test_stall_is_the_prompt_over_the_decode_round(decodes: int, prompt_tokens: int) -> None:
    assert stall_factor(decodes, prompt_tokens) >= 1.0
    assert added_delay(decodes, prompt_tokens) == pytest.approx(0.1 * prompt_tokens)
    assert stall_factor(decodes, prompt_tokens) == pytest.approx(
        1 + added_delay(decodes, prompt_tokens) / iteration_time(decodes, 0)
    )


@pytest.mark.parametrize(
    ("prompts", "expected_ms"),
    [
        ([2000], 200.0),
        ([2000, 500, 100], 260.0),
        ([], 0.0),
        ((n for n in [10, 20]), 3.0),  # any iterable
    ],
)
def test_total_prompt_cost(prompts: list[int], expected_ms: float) -> None:
    assert total_prompt_cost(prompts) == pytest.approx(expected_ms)


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (STATIC, 0.625),  # 5 busy slot-iterations out of 8
        (CONTINUOUS, 5 / 6),  # 5 out of 6
        ([["A", "B"]], 1.0),
        ([[None, None]], 0.0),
        ([[1, None, 2, None]], 0.5),  # any hashable id
    ],
)
def test_utilization(schedule: list[list[object]], expected: float) -> None:
    assert utilization(schedule) == pytest.approx(expected)


def test_static_utilization_is_exact() -> None:
    assert utilization(STATIC) == 0.625


def test_utilization_of_an_empty_schedule_raises() -> None:
    with pytest.raises(ValueError):
        utilization([])


@pytest.mark.parametrize(
    ("decodes", "prefill_tokens"), [(4, 0), (4, 2000), (0, 2000), (128, 0), (4, 512), (0, 0)]
)
def test_the_simulators_toy_preset_prices_a_forward_with_the_toy_model(
    decodes: int, prefill_tokens: int
) -> None:
    # ``roundgate simulate --costs toy``: a rank's forward is exactly ``iteration_time``.
    toy = PRESETS["toy"]
    assert toy.rank_ms(decodes, prefill_tokens) == iteration_time(decodes, prefill_tokens)
