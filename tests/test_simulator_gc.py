"""The engine processes' stop-the-world collections on the simulator's clock (``RoundCosts.
gc_every_requests`` / ``gc_pause_per_request_ms``): driven by the requests each rank finishes
(the work done), not by round counts; where they land, what they cost, and that the fast path
still equals the full rounds with them on."""

from __future__ import annotations

import dataclasses
import json

import pytest
from sim_builders import make_spec, sim_args

from roundgate.sim.arrivals import Arrival
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS, RoundCosts
from roundgate.sim.router import Router
from roundgate.sim.simulator import GroupSimulator
from roundgate.sim.workload import generate


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


def test_each_finish_due_stalls_the_next_round_by_the_batch_left() -> None:
    # One rank runs four requests of 10, 20, 30 and 40 tokens and collects after each
    # request it finishes: the round after the 1st finish waits 7 ms x 3 running, after the
    # 2nd 7 x 2, after the 3rd 7 x 1; the 4th finish leaves no busy round to stall.
    arrivals = [Arrival(0.0, 10, n, rank=0) for n in (10, 20, 30, 40)]
    plain = simulate(PRESETS["toy"], arrivals)
    costs = dataclasses.replace(PRESETS["toy"], gc_every_requests=1, gc_pause_per_request_ms=7.0)
    paused = simulate(costs, arrivals)
    assert paused.busy_rounds == plain.busy_rounds
    assert (paused.collections, plain.collections) == (3, 0)
    assert (paused.duration_s - plain.duration_s) * 1000 == pytest.approx(7.0 * (3 + 2 + 1))
    stretched = sorted(b - a for a, b in zip(plain.itl_ms, paused.itl_ms, strict=True))
    assert [round(d, 6) for d in stretched if d > 1e-9][:1] == [7.0]


def test_the_ranks_are_staggered_so_a_balanced_group_collects_every_period() -> None:
    costs = RoundCosts(gc_every_requests=8, gc_pause_per_request_ms=1.0)
    assert costs.gc_first(4) == [2, 4, 6, 8]
    assert costs.gc_period() == 8
    # Two ranks, four requests each, one collection every 4 own requests: rank 0 is due
    # after its 2nd finish, rank 1 after its 4th (its last, with nothing left to stall).
    arrivals = [Arrival(0.0, 10, n, rank=r) for r in (0, 1) for n in (5, 10, 15, 20)]
    costs = dataclasses.replace(PRESETS["toy"], gc_every_requests=4, gc_pause_per_request_ms=1.0)
    assert simulate(costs, arrivals, dp=2).collections == 1


def test_off_unless_both_terms_are_set() -> None:
    assert RoundCosts(gc_every_requests=10).gc_period() == 0
    assert RoundCosts(gc_pause_per_request_ms=1.0).gc_period() == 0


def test_a_fractional_period_is_refused() -> None:
    with pytest.raises(ValueError, match="gc_every_requests"):
        RoundCosts(gc_every_requests=2.5)


def test_a_policy_with_more_rounds_pays_no_more_collections() -> None:
    # The issue with round-count collections: a policy running more, shorter rounds paid
    # more pauses. Driven by requests finished, every policy pays the same number.
    costs = dataclasses.replace(
        PRESETS["h100-dsv3"], gc_every_requests=12, gc_pause_per_request_ms=3.0
    )
    arrivals = generate(make_spec(num_requests=80, rate=8.0, input_len=60, output_len=30))
    runs = {p: simulate(costs, arrivals, dp=4, policy=p) for p in ("none", "roundgate")}
    assert runs["none"].busy_rounds != runs["roundgate"].busy_rounds
    assert runs["none"].collections == runs["roundgate"].collections > 0


@pytest.mark.parametrize("policy", ["none", "roundgate", "local-interval"])
def test_the_fast_path_equals_full_rounds_with_collections(policy: str) -> None:
    costs = dataclasses.replace(
        PRESETS["h100-dsv3"], gc_every_requests=5, gc_pause_per_request_ms=3.0
    )
    spec = make_spec(num_requests=50, rate=4.0, input_len=40, output_len=30)
    slow = simulate(costs, generate(spec), dp=4, fast=False, policy=policy)
    fast = simulate(costs, generate(spec), dp=4, fast=True, policy=policy)
    assert json.dumps(summarize(fast), sort_keys=True) == json.dumps(
        summarize(slow), sort_keys=True
    )
    assert list(fast.itl_ms) == list(slow.itl_ms)
    assert fast.collections == slow.collections > 0  # and they did land
