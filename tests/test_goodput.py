"""Goodput (requests meeting a TTFT and an ITL-p99 SLO) and the TTFT-ITL Pareto front."""

from __future__ import annotations

import json
import random
from array import array
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sim_builders import make_spec, sim_args

from roundgate.bench.client import RequestResult
from roundgate.bench.report import summarize as bench_summary
from roundgate.cli.main import main
from roundgate.sim.goodput import Slo, count_slow, goodput, meets_itl_p99
from roundgate.sim.pareto import Point, pareto_front
from roundgate.sim.records import RequestRecord, SimResult
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import RouterSpec
from roundgate.sim.simulator import GroupSimulator
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.workload import generate

SLO = Slo(ttft_ms=1000.0, itl_ms=100.0)


def record(ttft_ms: float, num_output: int, slow_gaps: int, finished: bool = True):
    rec = RequestRecord(rank=0, arrival_s=1.0, prompt_tokens=10)
    rec.first_token_s = 1.0 + ttft_ms / 1000.0
    rec.last_token_s = rec.first_token_s + 0.05 * (num_output - 1)
    rec.num_output = num_output
    rec.slow_gaps = slow_gaps
    rec.finish_s = rec.last_token_s if finished else None
    return rec


def result_of(records: list[RequestRecord], itl_slo_ms: float = SLO.itl_ms) -> SimResult:
    return SimResult(
        "none", 1, 10.0, 100, 100, 0, 100, records, array("d"), None, 0, itl_slo_ms=itl_slo_ms
    )


# (TTFT ms, outputs, gaps above the ITL SLO, finished) -> good?
CASES = [
    ((999.0, 201, 2, True), True),  # 200 gaps: 2 may exceed (its p99 is the 198th smallest)
    ((999.0, 201, 3, True), False),  # 3 exceed: the p99 is above the SLO
    ((1000.0, 50, 0, True), True),  # TTFT exactly at the bound
    ((1000.1, 50, 0, True), False),  # TTFT just over
    ((10.0, 100, 1, True), False),  # 99 gaps: none may exceed
    ((10.0, 101, 1, True), True),  # 100 gaps: one may
    ((10.0, 1, 0, True), True),  # one token: no gap, any ITL SLO met
    ((10.0, 50, 0, False), False),  # unfinished: never good
]


def test_goodput_counts_exactly_the_requests_meeting_both_slos() -> None:
    records = [record(*args) for args, _ in CASES]
    result = goodput(result_of(records), SLO)
    expected = sum(good for _, good in CASES)
    assert (result.good, result.requests) == (expected, len(CASES))
    assert result.requests_per_s == pytest.approx(expected / 10.0)
    assert result.fraction == pytest.approx(expected / len(CASES))
    for args, good in CASES:
        assert goodput(result_of([record(*args)]), SLO).good == good, args


def test_itl_p99_rule_is_the_nearest_rank_p99_of_the_gaps() -> None:
    rng = random.Random(3)
    for _ in range(300):
        gaps = [rng.expovariate(1 / 40.0) for _ in range(rng.randint(1, 400))]
        slo = rng.uniform(20.0, 200.0)
        p99 = float(np.percentile(gaps, 99, method="inverted_cdf"))
        assert meets_itl_p99(count_slow(gaps, slo), len(gaps)) == (p99 <= slo)


def test_goodput_refuses_a_run_counted_against_another_itl_slo() -> None:
    with pytest.raises(ValueError, match="--slo-itl-ms 100"):
        goodput(result_of([], itl_slo_ms=float("inf")), SLO)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [({"ttft_ms": 0.0}, "--slo-ttft-ms"), ({"itl_ms": -1.0}, "--slo-itl-ms")],
)
def test_slo_refusals_name_the_flag(kwargs, flag) -> None:
    with pytest.raises(ValueError, match=flag):
        Slo(**kwargs)


@pytest.mark.parametrize("policy", ["roundgate", "none", "sglang-delayer"])
def test_each_request_counts_its_slow_gaps_on_both_paths(policy) -> None:
    """The counts equal the run's gaps above the SLO, with and without the fast path."""
    workload = tuple(generate(make_spec(num_requests=80, rate=60.0, output_len=40)))
    slo_ms = 40.0
    runs = []
    for fast in (True, False):
        sim = GroupSimulator(
            sim_args(policy),
            PRESETS["h100-dsv3"],
            RouterSpec().build(4, 0, 16),
            policy,
            keep_timeline=False,
            fast_forward=fast,
        )
        runs.append(sim.run(workload, itl_slo_ms=slo_ms))
    for result in runs:
        assert sum(r.slow_gaps for r in result.records) == sum(g > slo_ms for g in result.itl_ms)
    assert [r.slow_gaps for r in runs[0].records] == [r.slow_gaps for r in runs[1].records]
    assert any(r.slow_gaps for r in runs[0].records)


def test_counting_slow_gaps_changes_no_figure() -> None:
    spec = SimSpec(sim_args(), make_spec(), PRESETS["h100-dsv3"])
    plain, counted = simulate(spec), simulate(replace(spec, itl_slo_ms=30.0))
    assert list(plain.itl_ms) == list(counted.itl_ms)
    strip = [{**vars(r), "slow_gaps": 0} for r in counted.records]
    assert [vars(r) for r in plain.records] == strip


def point(ttft: float, itl: float, name: str = "p") -> Point:
    return Point(name, (("x", ttft),), ttft, itl)


def test_pareto_front_holds_no_dominated_point_and_every_undominated_one() -> None:
    rng = random.Random(5)
    for _ in range(50):
        points = [point(rng.randint(1, 30), rng.randint(1, 30)) for _ in range(25)]
        front = pareto_front(points)
        assert not any(p.dominates(q) for p in front for q in front)
        for p in points:
            on_front = any(
                (q.ttft_p99_ms, q.itl_p99_ms) == (p.ttft_p99_ms, p.itl_p99_ms) for q in front
            )
            assert on_front != any(q.dominates(p) for q in points)
        assert [p.ttft_p99_ms for p in front] == sorted(p.ttft_p99_ms for p in front)


def test_pareto_front_of_a_table() -> None:
    points = [point(100, 50), point(200, 40), point(150, 60), point(300, 40), point(90, 90)]
    front = [(p.ttft_p99_ms, p.itl_p99_ms) for p in pareto_front(points)]
    assert front == [(90, 90), (100, 50), (200, 40)]


SMALL = [
    "--dp-size", "2", "--max-num-seqs", "16", "--num-kv-pages", "128", "--page-size", "16",
    "--num-requests", "24", "--rate", "50", "--input-len", "64", "--output-len", "6",
]  # fmt: skip


def test_simulate_reports_goodput_in_the_table_and_the_json(tmp_path: Path, capsys) -> None:
    path = tmp_path / "sim.json"
    argv = ["simulate", *SMALL, "--no-progress", "--compare", "roundgate,none"]
    assert main([*argv, "--slo-ttft-ms", "500", "--slo-itl-ms", "80", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "goodput (TTFT <= 500 ms and ITL p99 <= 80 ms):" in out
    report = json.loads(path.read_text())
    assert set(report["goodput"]) == {"roundgate", "none"}
    for g in report["goodput"].values():
        assert g["slo"] == {"ttft_ms": 500.0, "itl_ms": 80.0}
        assert 0 <= g["good_requests"] <= g["requests"] == 24


def test_tune_prints_each_policys_pareto_front(tmp_path: Path, capsys) -> None:
    path = tmp_path / "tune.json"
    argv = ["tune", *SMALL, "--costs", "h100-dsv3", "--attempt-intervals", "1,2"]
    argv += ["--any-intervals", "2,8", "--pareto", "roundgate,vllm-interval,none"]
    assert main([*argv, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Pareto fronts" in out and "ITL p99 <= 200 ms" in out.splitlines()[0]
    report = json.loads(path.read_text())
    assert set(report["pareto"]) == {"roundgate", "vllm-interval", "none"}
    for name, front in report["pareto"].items():
        pts = [Point(name, (), p["ttft_p99_ms"], p["itl_p99_ms"]) for p in front]
        assert pts and not any(p.dominates(q) for p in pts for q in pts)
    assert len(report["pareto"]["none"]) == 1


def test_bench_goodput_uses_the_itl_p99_rule() -> None:
    def live(ttft_s: float, gaps_ms: list[float]) -> RequestResult:
        gaps = [g / 1000 for g in gaps_ms]
        return RequestResult(
            10, 50, 0, ttft_s=ttft_s, e2e_s=ttft_s + sum(gaps), chunk_gaps_s=gaps,
            output_tokens=len(gaps) + 1,
        )  # fmt: skip

    results = [
        live(0.5, [50.0] * 199 + [900.0]),  # one stall in 200 gaps: p99 still 50 ms
        live(0.5, [50.0] * 90 + [900.0]),  # one stall in 91 gaps: p99 900 ms
        live(3.0, [50.0] * 10),  # TTFT over
    ]
    summary = bench_summary(results, 10.0, 2000.0, 200.0)
    assert summary["goodput_fraction"] == pytest.approx(1 / 3, abs=1e-4)
    assert summary["goodput_requests_per_s"] == pytest.approx(0.1)
