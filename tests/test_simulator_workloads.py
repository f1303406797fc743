"""Simulator inputs: seeded workload generation and its refusals, the routers, trace files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sim_builders import make_spec, sim_args, write_trace

from roundgate.sim.arrivals import Arrival
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import Router
from roundgate.sim.simulator import GroupSimulator
from roundgate.sim.workload import generate, load_trace

# --- workloads ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arrival", ["poisson", "bursty"])
@pytest.mark.parametrize("dist", ["fixed", "uniform", "exponential"])
def test_generated_workloads_are_seeded_sorted_and_sized(arrival: str, dist: str) -> None:
    spec = make_spec(arrival=arrival, length_dist=dist, num_requests=50, burst_size=4)
    arrivals = generate(spec)
    assert arrivals == generate(spec)
    assert len(arrivals) == 50
    assert [a.time_s for a in arrivals] == sorted(a.time_s for a in arrivals)
    assert all(a.prompt_tokens >= 1 and a.output_tokens >= 1 and a.rank is None for a in arrivals)
    if dist == "fixed":
        assert {(a.prompt_tokens, a.output_tokens) for a in arrivals} == {(120, 12)}
    if arrival == "bursty":
        sizes = Counter(a.time_s for a in arrivals).values()
        assert set(sizes) <= {4, 2} and sum(sizes) == 50  # 12 bursts of 4, then the last 2


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"rate": -1.0}, "--rate"),
        ({"rate": 0.0}, "--rate"),
        ({"num_requests": 0}, "--num-requests"),
        ({"input_len": 0}, "--input-len"),
        ({"output_len": -3}, "--output-len"),
        ({"burst_size": 0}, "--burst-size"),
        ({"arrival": "uniform"}, "--arrival"),
        ({"length_dist": "normal"}, "--length-dist"),
        ({"arrival": "trace"}, "--trace"),
    ],
)
def test_workload_spec_refusals_name_the_flag(overrides: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        make_spec(**overrides)


# --- routing --------------------------------------------------------------------------------------


@pytest.mark.parametrize("weights", [[8, 1, 1, 1], [1, 1, 1, 1], [3, 0, 1, 0]])
def test_skewed_router_is_weights_proportional(weights: list[int]) -> None:
    n = 22_000
    router = Router("skewed", 4, weights, seed=3)
    counts = Counter(router.route([0, 0, 0, 0]) for _ in range(n))
    total = sum(weights)
    for rank, weight in enumerate(weights):
        p = weight / total
        sigma = (n * p * (1 - p)) ** 0.5
        assert abs(counts[rank] - n * p) <= 4 * sigma + 1, (rank, counts)


def test_skewed_routing_through_the_simulator() -> None:
    spec = make_spec(num_requests=400, rate=400.0, input_len=16, output_len=2, length_dist="fixed")
    args = sim_args("none")
    sim = GroupSimulator(args, PRESETS["toy"], Router("skewed", 4, [8, 1, 1, 0], seed=1))
    result = sim.run(generate(spec))
    counts = Counter(r.rank for r in result.records)
    assert counts[3] == 0
    assert counts[0] / 400 == pytest.approx(0.8, abs=0.08)
    assert counts[1] / 400 == pytest.approx(0.1, abs=0.05)


def test_round_robin_and_least_loaded_routers() -> None:
    rr = Router("round-robin", 3)
    assert [rr.route([0, 0, 0]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    ll = Router("least-loaded", 3)
    assert ll.route([4, 1, 1]) == 1  # ties go to the lowest rank
    assert ll.route([0, 1, 1]) == 0


@pytest.mark.parametrize(
    ("policy", "dp_size", "weights", "flag"),
    [
        ("skewed", 4, [8, 1], "--route-weights needs 4 weights"),
        ("skewed", 2, None, "--route-weights needs 2 weights"),
        ("skewed", 2, [0, 0], "positive sum"),
        ("skewed", 2, [-1, 3], ">= 0"),
        ("round-robin", 2, [1, 1], "--route-weights applies to --router skewed only"),
        ("random", 2, None, "--router"),
    ],
)
def test_router_refusals_name_the_flag(policy: str, dp_size: int, weights, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        Router(policy, dp_size, weights)


# --- traces ---------------------------------------------------------------------------------------


def test_trace_file_is_loaded_sorted_with_pinned_ranks(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path / "t.jsonl",
        [
            {"time_s": 0.5, "prompt_tokens": 30, "output_tokens": 3, "rank": 1},
            "",
            {"time_s": 0.1, "prompt_tokens": 10, "output_tokens": 2},
            {"time_s": 0.3, "prompt_tokens": 20, "output_tokens": 4, "rank": None},
        ],
    )
    assert load_trace(path) == [
        Arrival(0.1, 10, 2, None),
        Arrival(0.3, 20, 4, None),
        Arrival(0.5, 30, 3, 1),
    ]
    spec = make_spec(arrival="trace", trace=str(path))
    assert generate(spec) == load_trace(path)
    args = sim_args(dp_size=2)
    result = GroupSimulator(args, PRESETS["toy"], Router("least-loaded", 2)).run(generate(spec))
    assert result.unfinished == 0
    by_prompt = {r.prompt_tokens: r for r in result.records}
    assert by_prompt[30].rank == 1  # pinned
    assert sum(r.num_output for r in result.records) == 9


@pytest.mark.parametrize(
    ("records", "message"),
    [
        (["{not json"], r"t.jsonl:1: bad record"),
        ([{"time_s": 0.1, "prompt_tokens": 3}], r"t.jsonl:1: bad record"),
        ([{"time_s": 0, "prompt_tokens": 1, "output_tokens": 1}, {"time_s": "x"}], r":2: bad"),
        ([{"time_s": 0.1, "prompt_tokens": 0, "output_tokens": 1}], "lengths must be >= 1"),
        ([{"time_s": -1, "prompt_tokens": 4, "output_tokens": 1}], "time >= 0"),
        (["", "  "], "no records"),
    ],
)
def test_bad_traces_are_refused_naming_the_flag(tmp_path: Path, records, message: str) -> None:
    path = write_trace(tmp_path / "t.jsonl", records)
    with pytest.raises(ValueError, match=f"--trace .*{message}"):
        load_trace(path)


def test_unreadable_trace_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--trace .*cannot read"):
        load_trace(tmp_path / "missing.jsonl")


def test_trace_pinning_a_rank_outside_the_group_is_refused(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path / "t.jsonl", [{"time_s": 0, "prompt_tokens": 4, "output_tokens": 1, "rank": 5}]
    )
    sim = GroupSimulator(sim_args(dp_size=2), PRESETS["toy"], Router("round-robin", 2))
    with pytest.raises(ValueError, match="rank 5, outside dp_size"):
        sim.run(load_trace(path))
