"""The simulator's expert load: a seeded, skewed, drifting popularity; static and EPLB
placements priced by the most-loaded rank; the flags that turn it on, refused by name where
they cannot apply; and the default (mean-load) path left exactly as it was."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from roundgate.cli.main import build_parser, main
from roundgate.sim.expert_load import ExpertPopularity, PopularitySpec, hottest_over_mean
from roundgate.sim.expert_parallel import ExpertBalancer, ExpertSpec
from roundgate.sim.options import sim_specs
from roundgate.sim.report import summarize
from roundgate.sim.spec import simulate

# A small run on the DeepSeek-V3 preset: 4 ranks (256 experts divide over them).
BASE = [
    "simulate",
    "--costs", "h100-dsv3",
    "--dp-size", "4",
    "--max-num-seqs", "64",
    "--num-kv-pages", "64",
    "--page-size", "16",
    "--num-requests", "32",
    "--rate", "40",
    "--input-len", "64",
    "--output-len", "12",
    "--no-progress",
]  # fmt: skip


def spec_of(*extra: str):
    (spec,) = sim_specs(build_parser().parse_args([*BASE, *extra]))
    return spec


# --- the popularity ------------------------------------------------------------------------


def shares_over(spec: PopularitySpec, rounds: int) -> list[list[list[float]]]:
    popularity = ExpertPopularity(spec)
    seen = []
    for _ in range(rounds):
        seen.append(popularity.shares())
        popularity.advance()
    return seen


def test_popularity_is_seeded_and_deterministic() -> None:
    spec = PopularitySpec(num_experts=64, num_layers=2, skew=0.5, drift=0.05, seed=7)
    assert shares_over(spec, 20) == shares_over(spec, 20)
    assert shares_over(spec, 20) != shares_over(replace(spec, seed=8), 20)


def test_popularity_is_skewed_and_sums_to_one_per_layer() -> None:
    (layer,) = ExpertPopularity(PopularitySpec(256, 1, skew=0.5, drift=0.0)).shares()
    assert math.isclose(sum(layer), 1.0)
    assert hottest_over_mean(layer) > 2.0  # a few experts get several times their share
    assert min(layer) * len(layer) < 0.5  # and a cool tail gets far less
    (uniform,) = ExpertPopularity(PopularitySpec(256, 1, skew=0.0, drift=0.0)).shares()
    assert set(uniform) == {1 / 256}


def test_drift_moves_the_hot_set_but_keeps_the_spread() -> None:
    popularity = ExpertPopularity(PopularitySpec(256, 1, skew=0.5, drift=0.05, seed=1))
    (start,) = popularity.shares()
    for _ in range(2000):
        popularity.advance()
    (end,) = popularity.shares()
    logs_start = [math.log(s) for s in start]
    logs_end = [math.log(s) for s in end]
    # The mean-reverting walk keeps the log spread near --expert-skew ...
    assert 0.4 < statistics.pstdev(logs_end) < 0.6
    # ... while which experts are hot has largely changed (correlation ~ keep^2000 ~ 0.37).
    assert statistics.correlation(logs_start, logs_end) < 0.6


# --- placements ----------------------------------------------------------------------------


def balance_after(spec: ExpertSpec, rounds: int, tokens: int = 256) -> ExpertBalancer:
    balancer = ExpertBalancer(spec)
    for _ in range(rounds):
        balancer.extra_ms(10.0, tokens)
    return balancer


def test_eplb_balances_better_than_static_under_skew() -> None:
    common = {"dp_size": 32, "skew": 0.6, "drift": 0.0, "num_layers": 2}
    static = balance_after(ExpertSpec("static", **common), 40)
    eplb = balance_after(ExpertSpec("eplb", interval_rounds=10, window_rounds=5, **common), 40)
    redundant = balance_after(
        ExpertSpec("eplb", interval_rounds=10, window_rounds=5, num_redundant_experts=32, **common),
        40,
    )
    # Static never moves; EPLB re-placed at rounds 10, 20, 30 and 40 from what it measured.
    assert static.rebalances == 0 and eplb.rebalances == redundant.rebalances == 4
    static_now, eplb_now, redundant_now = (b.imbalance()[1] for b in (static, eplb, redundant))
    assert static_now < 0.8 < eplb_now
    assert redundant_now >= eplb_now
    # The run's mean counts EPLB's first interval on the initial (static) placement too.
    assert static.stats().mean_balancedness < eplb.stats().mean_balancedness


def test_at_large_dp_only_redundant_copies_split_hot_experts() -> None:
    # 2 experts a rank at dp 128: repacking alone cannot split the hottest expert's load.
    common = {"dp_size": 128, "skew": 0.6, "drift": 0.0, "num_layers": 1}
    plain = balance_after(ExpertSpec("eplb", interval_rounds=2, window_rounds=1, **common), 2)
    copies = balance_after(
        ExpertSpec("eplb", interval_rounds=2, window_rounds=1, num_redundant_experts=128, **common),
        2,
    )
    assert plain.imbalance()[1] < copies.imbalance()[1]


def test_the_stretch_prices_the_expert_share_of_the_slowest_rank_and_the_pause() -> None:
    spec = ExpertSpec("eplb", dp_size=8, skew=0.6, drift=0.0, num_layers=1, rebalance_ms=50.0,
                      interval_rounds=3, window_rounds=1, compute_share=0.5)  # fmt: skip
    balancer = ExpertBalancer(spec)
    factor, _ = balancer.imbalance()
    assert balancer.extra_ms(20.0, 100) == pytest.approx(0.5 * 20.0 * (factor - 1.0))
    balancer.extra_ms(20.0, 100)
    third = balancer.extra_ms(20.0, 100)  # the interval ends: re-placed, pause charged
    assert balancer.rebalances == 1
    assert third == pytest.approx(0.5 * 20.0 * (factor - 1.0) + 50.0)
    assert balancer.imbalance()[0] < factor


# --- whole runs ----------------------------------------------------------------------------


def without_experts(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "experts"}


def test_uniform_popularity_costs_exactly_the_mean_load_price() -> None:
    mean_load = summarize(simulate(spec_of()))
    for placement in ("static", "eplb"):
        flags = ["--expert-placement", placement, "--expert-skew", "0", "--expert-drift", "0"]
        uniform = summarize(simulate(spec_of(*flags)))
        assert uniform["experts"]["mean_factor"] == 1.0
        assert without_experts(uniform) == mean_load


def test_skew_slows_a_static_group_and_eplb_recovers_some() -> None:
    # Closed loop (a fixed number of clients): throughput follows the round time.
    closed = ("--concurrency", "32", "--expert-skew", "0.8")
    mean_load = summarize(simulate(spec_of("--concurrency", "32")))
    static = summarize(simulate(spec_of(*closed, "--expert-placement", "static")))
    eplb = summarize(
        simulate(
            spec_of(
                *closed, "--expert-placement", "eplb", "--num-redundant-experts", "4",
                "--eplb-interval-rounds", "5", "--eplb-window-rounds", "5",
            )
        )
    )  # fmt: skip
    assert static["output_tokens_per_s"] < mean_load["output_tokens_per_s"]
    assert static["itl_ms"]["p50"] > mean_load["itl_ms"]["p50"]
    assert eplb["experts"]["rebalances"] > 0
    assert static["experts"]["mean_balancedness"] < eplb["experts"]["mean_balancedness"] < 1
    assert eplb["itl_ms"]["p50"] < static["itl_ms"]["p50"]
    assert eplb["output_tokens_per_s"] > static["output_tokens_per_s"]


def test_the_default_path_is_unchanged(tmp_path: Path) -> None:
    spec = spec_of()
    assert spec.experts is None
    assert build_parser().parse_args(BASE).expert_placement is None
    reports = []
    for name, extra in (("default", []), ("none", ["--expert-placement", "none"])):
        path = tmp_path / f"{name}.json"
        assert main([*BASE, "--json", str(path), *extra]) == 0
        reports.append(json.loads(path.read_text()))
    assert "experts" not in reports[0]["results"][0]
    assert reports[0]["results"] == reports[1]["results"]


# --- flags -----------------------------------------------------------------------------------

BAD_FLAGS = [
    pytest.param(["--costs", "toy", "--expert-placement", "static"], "--expert-placement",
                 id="dense-preset"),
    pytest.param(["--expert-skew", "0.5"], "--expert-skew", id="skew-without-placement"),
    pytest.param(["--expert-placement", "static", "--expert-skew", "-1"], "--expert-skew",
                 id="negative-skew"),
    pytest.param(["--expert-placement", "static", "--expert-drift", "0.9"], "--expert-drift",
                 id="drift-above-skew"),
    pytest.param(["--expert-placement", "static", "--num-redundant-experts", "4"],
                 "--num-redundant-experts", id="redundant-on-static"),
    pytest.param(["--expert-placement", "eplb", "--num-redundant-experts", "3"],
                 "--num-redundant-experts", id="slots-do-not-divide"),
    pytest.param(["--expert-placement", "eplb", "--eplb-interval-rounds", "0"],
                 "--eplb-interval-rounds", id="zero-interval"),
    pytest.param(["--expert-placement", "eplb", "--eplb-interval-rounds", "10",
                  "--eplb-window-rounds", "20"], "--eplb-window-rounds", id="window-over-interval"),
    pytest.param(["--expert-placement", "static", "--expert-compute-share", "1.5"],
                 "--expert-compute-share", id="share-above-one"),
    pytest.param(["--expert-placement", "eplb", "--eplb-rebalance-ms", "-5"],
                 "--eplb-rebalance-ms", id="negative-pause"),
    pytest.param(["--expert-placement", "static", "--expert-layers", "0"], "--expert-layers",
                 id="no-layers"),
    pytest.param(["--expert-placement", "random"], "--expert-placement", id="unknown-placement"),
    pytest.param(["--expert-placement", "static", "--disaggregate", "2:2"], "--expert-placement",
                 id="disaggregate"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "flag"), BAD_FLAGS)
def test_bad_expert_flags_are_a_one_line_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*BASE, *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, err
    assert flag in error_lines[0], error_lines[0]
    assert "Traceback" not in err


def test_a_cost_file_based_on_a_moe_preset_accepts_the_flags(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"base": "gb200-dsv3", "gather_ms": 0.5}))
    spec = spec_of("--costs", str(path), "--expert-placement", "static")
    assert spec.experts is not None and spec.experts.shape.num_experts == 256
