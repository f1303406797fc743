"""The engine processes' stop-the-world collections on the simulator's clock (``RoundCosts.
gc_every_rounds`` / ``gc_pause_per_request_ms``): where they land, what they cost, and that
the fast path still equals the full rounds with them on."""

from __future__ import annotations

import dataclasses
import json

import pytest
from sim_builders import make_spec, sim_args

from sim.arrivals import Arrival
from sim.report import summarize
from sim.round_costs import PRESETS, RoundCosts
from sim.router import Router
from sim.simulator import GroupSimulator
from sim.workload import generate


def simulate(costs: RoundCosts, arrivals, dp: int = 1, fast: bool = True, policy: str = "none"):
    sim = GroupSimulator(
        sim_args(policy, dp_size=dp),
        costs,
        Router("round-robin", dp),
        policy,
        keep_timeline=False,
        fast_forward=fast,
    )
    return sim.run(arrivals)


def test_each_collection_stalls_its_round_by_the_batch_it_runs() -> None:
    # One rank decoding one request: every 10th busy round collects, 7 ms per request.
    arrivals = [Arrival(0.0, 10, 60, rank=0)]
    plain = simulate(PRESETS["toy"], arrivals)
    costs = dataclasses.replace(PRESETS["toy"], gc_every_rounds=10, gc_pause_per_request_ms=7.0)
    paused = simulate(costs, arrivals)
    assert paused.busy_rounds == plain.busy_rounds == 60
    collections = plain.busy_rounds // 10
    assert paused.duration_s - plain.duration_s == pytest.approx(collections * 0.007)
    stretched = [b - a for a, b in zip(plain.itl_ms, paused.itl_ms, strict=True)]
    # Rounds 10, 20, ... 60 collect: the 1st round gives the first token, so the ITL
    # samples of rounds 10..60 (indices 8, 18, ...) are 7 ms longer; the rest are equal.
    assert [i for i, d in enumerate(stretched) if d] == [8, 18, 28, 38, 48, 58]
    assert all(d == pytest.approx(7.0) for d in stretched if d)


def test_ranks_take_turns_and_the_pause_follows_the_collectors_batch() -> None:
    # Rank 0 runs three requests, rank 1 one; two ranks collecting every 4 rounds each take
    # turns every 2nd round: rank 0 at busy rounds 2, 6, 10...; rank 1 at 4, 8, 12...
    arrivals = [Arrival(0.0, 10, 40, rank=r) for r in (0, 0, 0, 1)]
    plain = simulate(PRESETS["toy"], arrivals, dp=2)
    costs = dataclasses.replace(PRESETS["toy"], gc_every_rounds=4, gc_pause_per_request_ms=1.0)
    paused = simulate(costs, arrivals, dp=2)
    assert paused.busy_rounds == plain.busy_rounds == 40
    by_rank0, by_rank1 = len(range(2, 41, 4)), len(range(4, 41, 4))
    extra_ms = (paused.duration_s - plain.duration_s) * 1000
    assert extra_ms == pytest.approx(3.0 * by_rank0 + 1.0 * by_rank1)


def test_off_unless_both_terms_are_set() -> None:
    assert RoundCosts(gc_every_rounds=10).gc_stride(4) == 0
    assert RoundCosts(gc_pause_per_request_ms=1.0).gc_stride(4) == 0
    assert RoundCosts(gc_every_rounds=10, gc_pause_per_request_ms=1.0).gc_stride(4) == 2
    assert RoundCosts(gc_every_rounds=2, gc_pause_per_request_ms=1.0).gc_stride(8) == 1


def test_a_fractional_period_is_refused() -> None:
    with pytest.raises(ValueError, match="gc_every_rounds"):
        RoundCosts(gc_every_rounds=2.5)


@pytest.mark.parametrize("policy", ["none", "roundgate", "local-interval"])
def test_the_fast_path_equals_full_rounds_with_collections(policy: str) -> None:
    costs = dataclasses.replace(
        PRESETS["h100-dsv3"], gc_every_rounds=36, gc_pause_per_request_ms=3.0
    )
    spec = make_spec(num_requests=50, rate=4.0, input_len=40, output_len=30)
    slow = simulate(costs, generate(spec), dp=4, fast=False, policy=policy)
    fast = simulate(costs, generate(spec), dp=4, fast=True, policy=policy)
    assert json.dumps(summarize(fast), sort_keys=True) == json.dumps(
        summarize(slow), sort_keys=True
    )
    assert list(fast.itl_ms) == list(slow.itl_ms)
    # The collections did land: the tokens wait longer in total than without them.
    plain = simulate(PRESETS["h100-dsv3"], generate(spec), dp=4, policy=policy)
    assert sum(slow.itl_ms) > sum(plain.itl_ms)
