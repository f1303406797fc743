"""Simulator runs: reproducible seeded summaries, their counts, the gate's batching, the table."""

from __future__ import annotations

import json

import pytest
from sim_builders import make_spec, sim_args, simulate

from roundgate.actors.control.round import RoundKind
from roundgate.sim.report import format_table, percentiles, summarize
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import Router
from roundgate.sim.simulator import KIND_CODES, GroupSimulator
from roundgate.sim.workload import generate

POLICIES = ("roundgate", "none", "local-interval")
EXTENDS = {KIND_CODES[RoundKind.PREFILL], KIND_CODES[RoundKind.MIXED]}  # kinds that extend


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
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
        assert 0 < summary[key]["p50"] <= summary[key]["p90"] <= summary[key]["p99"]
    # The means are the plain means of what the records hold.
    e2e = [(r.finish_s - r.arrival_s) * 1000 for r in result.records]
    assert summary["e2e_ms"]["mean"] == pytest.approx(sum(e2e) / len(e2e), abs=1e-3)
    assert summary["itl_ms"]["mean"] == pytest.approx(
        sum(result.itl_ms) / len(result.itl_ms), abs=1e-3
    )
    assert summary["requests_per_s"] == pytest.approx(
        len(arrivals) / summary["duration_s"], abs=1e-3
    )
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
