"""The group simulator: seeded workloads, routing, traces, and reproducible summaries."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from builders import make_args

from actors.control.round import RoundKind
from actors.server_args import ServerArgs
from deployment.sim.report import format_table, percentiles, summarize
from deployment.sim.round_costs import PRESETS, RoundCosts
from deployment.sim.simulator import KIND_CODES, GroupSimulator
from deployment.sim.workload import Arrival, Router, WorkloadSpec, generate, load_trace

POLICIES = ("roundgate", "none", "local-interval")

# --- builders ---------------------------------------------------------------------------------


# A larger group than the builders' default: 16 running requests a rank, a 256-token round.
SIM_GROUP = {"max_scheduled_tokens": 256, "page_size": 16, "num_kv_pages": 256}
SIM_FLAGS = {
    "roundgate": {"prefill_any_attempt_interval": 6},
    "local-interval": {"prefill_decode_interval": 3},
}
EXTENDS = {KIND_CODES[RoundKind.PREFILL], KIND_CODES[RoundKind.MIXED]}  # kinds that extend


def sim_args(policy: str = "roundgate", dp_size: int = 4, **overrides) -> ServerArgs:
    values = {"max_num_seqs": 16 * dp_size, **SIM_GROUP, **SIM_FLAGS.get(policy, {})}
    return make_args(dp_size, policy, **(values | overrides))


def make_spec(**overrides) -> WorkloadSpec:
    values = {
        "num_requests": 60,
        "arrival": "poisson",
        "rate": 40.0,
        "input_len": 120,
        "output_len": 12,
        "length_dist": "uniform",
        "seed": 7,
    }
    return WorkloadSpec(**(values | overrides))


def simulate(
    policy: str = "roundgate",
    spec: WorkloadSpec | None = None,
    router: str = "round-robin",
    weights: list[int] | None = None,
    costs: RoundCosts | None = None,
    **arg_overrides,
) -> dict:
    args = sim_args(policy, **arg_overrides)
    sim = GroupSimulator(
        args,
        costs or PRESETS["h100-dsv3"],
        Router(router, args.dp_size, weights, seed=(spec or make_spec()).seed),
        policy,
        keep_timeline=True,
    )
    return summarize(sim.run(generate(spec or make_spec())))


def write_trace(path: Path, records: list[dict | str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


# --- reproducibility ----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("router", "weights", "arrival"),
    [("round-robin", None, "poisson"), ("skewed", [5, 1, 1, 1], "bursty")],
)
def test_same_seed_same_summary(policy: str, router: str, weights, arrival: str) -> None:
    spec = make_spec(arrival=arrival)
    first = json.dumps(simulate(policy, spec, router, weights), sort_keys=True)
    second = json.dumps(simulate(policy, spec, router, weights), sort_keys=True)
    assert first == second
    summary = json.loads(first)
    assert summary["unfinished"] == 0 and summary["requests"] == 60


def test_different_seeds_give_different_workloads() -> None:
    a = json.dumps(simulate(spec=make_spec(seed=1)), sort_keys=True)
    b = json.dumps(simulate(spec=make_spec(seed=2)), sort_keys=True)
    assert a != b


@pytest.mark.parametrize("policy", POLICIES)
def test_summary_counts_add_up(policy: str) -> None:
    arrivals = generate(make_spec())
    args = sim_args(policy)
    sim = GroupSimulator(args, PRESETS["h100-dsv3"], Router("round-robin", 4, seed=7), policy)
    result = sim.run(arrivals)
    summary = summarize(result)
    # Every busy round is a prefill round (some rank extended) or a decode round, and the
    # timeline (one kind per rank per round) says the same.
    assert summary["busy_rounds"] == summary["prefill_rounds"] + summary["decode_rounds"]
    assert 0 < summary["busy_rounds"] <= summary["rounds"] == result.rounds
    timeline = result.timeline
    assert timeline is not None and len(timeline.duration_ms) == result.rounds
    kinds = [timeline.kinds[i * 4 : (i + 1) * 4] for i in range(result.rounds)]
    extended = [i for i, ks in enumerate(kinds) if EXTENDS & set(ks)]
    assert len(extended) == summary["prefill_rounds"] > 0
    assert sum(any(ks) for ks in kinds) == summary["busy_rounds"]
    assert summary["decode_round_fraction"] == round(
        summary["decode_rounds"] / summary["busy_rounds"], 6
    )
    # Every request finished, in arrival order, with exactly its output length.
    assert (summary["requests"], summary["unfinished"]) == (len(arrivals), 0)
    for record, arrival in zip(result.records, arrivals, strict=True):
        assert (record.prompt_tokens, record.num_output) == (
            arrival.prompt_tokens,
            arrival.output_tokens,
        )
        assert record.arrival_s == arrival.time_s
        assert record.arrival_s <= record.first_token_s <= record.last_token_s == record.finish_s
    assert summary["output_tokens"] == sum(a.output_tokens for a in arrivals)
    # One inter-token latency per token after each request's first.
    assert len(result.itl_ms) == sum(a.output_tokens - 1 for a in arrivals)
    assert summary["output_tokens_per_s"] == round(
        summary["output_tokens"] / summary["duration_s"], 3
    )
    assert summary["duration_s"] >= sum(timeline.duration_ms) / 1000 - 1e-9
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert set(summary[key]) == {"p50", "p90", "p99"}
        assert 0 < summary[key]["p50"] <= summary[key]["p90"] <= summary[key]["p99"]
    # The admission-wait metric is the largest of the requests' waits.
    waits = [r.admission_wait for r in result.records if r.admission_wait is not None]
    assert summary["max_admission_wait_rounds"] == max(waits, default=None)
    if policy == "roundgate":
        # The gate held some prompt at least one round, and no rank prefilled while the
        # gate (one vote for the whole group) was closed.
        assert summary["max_admission_wait_rounds"] >= 1
        assert all(timeline.opened[i] for i in extended)
    if policy == "none":
        # Nothing holds prefill, so the group's ranks prefill in every round they can.
        assert all(timeline.opened)


def test_every_request_finishes_with_its_output_length() -> None:
    arrivals = generate(make_spec())
    args = sim_args()
    result = GroupSimulator(args, PRESETS["toy"], Router("round-robin", 4)).run(arrivals)
    assert result.unfinished == 0
    assert sum(r.num_output for r in result.records) == sum(a.output_tokens for a in arrivals)
    assert all(r.first_token_s is not None and r.finish_s >= r.arrival_s for r in result.records)


def test_max_rounds_stops_early_and_reports_unfinished() -> None:
    args = sim_args()
    sim = GroupSimulator(args, PRESETS["toy"], Router("round-robin", 4))
    result = sim.run(generate(make_spec()), max_rounds=5)
    assert result.rounds == 5 and result.unfinished > 0


def test_gate_batches_prefill_into_fewer_rounds_than_no_gate() -> None:
    # Scattered single arrivals on 4 ranks: the gate groups their prefill into shared rounds.
    spec = make_spec(num_requests=80, rate=30.0, length_dist="fixed", output_len=40)
    gated, ungated = simulate("roundgate", spec), simulate("none", spec)
    assert gated["prefill_rounds"] < ungated["prefill_rounds"]
    assert gated["decode_round_fraction"] > ungated["decode_round_fraction"]


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


# --- report helpers -------------------------------------------------------------------------------


def test_percentiles_of_nothing_are_none() -> None:
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}
    assert percentiles([1.0, 2.0, 3.0])["p50"] == 2.0


def test_table_shows_ratios_against_the_baseline() -> None:
    spec = make_spec(num_requests=20)
    table = format_table([simulate("none", spec), simulate("roundgate", spec)], baseline="none")
    lines = table.splitlines()
    assert lines[0].startswith("policy") and len(lines) == 3
    assert "x)" in lines[2] and "x)" not in lines[1]
