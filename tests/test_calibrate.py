"""``roundgate calibrate``: a --costs file from the shared nccl-tests samples and a scrape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nccl_samples import ALL_GATHER_SAMPLES, cases, sample_path
from prometheus_client import generate_latest

from roundgate.actors.telemetry.metrics import RankMetricSet
from roundgate.cli.main import main
from roundgate.nccl_log.read import parse
from roundgate.sim.calibration import gather_columns
from roundgate.sim.cost_fit import kind_totals
from roundgate.sim.gather_fit import interpolate_time_us
from roundgate.sim.round_costs import load_costs


def scrape(
    decode_s: list[float], extend_s: list[float], work: dict | None = None, group: str = "g0"
) -> str:
    """A real exposition of the engine's metrics with these group rounds recorded, and, when
    given, the busiest rank's work in them: ``{(kind, quantity): total}``."""
    metrics = RankMetricSet()
    for kind, values in (("decode", decode_s), ("extend", extend_s)):
        child = metrics.group_round_time.labels(group, "m", kind)
        for value in values:
            child.observe(value)
    for (kind, quantity), total in (work or {}).items():
        metrics.group_round_work.labels(group, "m", kind, quantity).inc(total)
    return generate_latest(metrics.registry).decode()


def priced_scrape(costs: dict, decodes: list[int], prompts: list[tuple[int, int]]) -> str:
    """A scrape of rounds that cost exactly what ``costs`` prices: decode rounds of the given
    batch sizes, extend rounds of (decodes, prompt tokens)."""
    price = load_costs("truth", json.dumps(costs))
    decode_s = [price.rank_ms(d, 0) / 1000 for d in decodes]
    extend_s = [price.group_ms([price.rank_ms(d, p)], True) / 1000 for d, p in prompts]
    work = {
        ("decode", "decodes"): sum(decodes),
        ("decode", "prefill_tokens"): 0,
        ("extend", "decodes"): sum(d for d, _ in prompts),
        ("extend", "prefill_tokens"): sum(p for _, p in prompts),
    }
    return scrape(decode_s, extend_s, work)


@pytest.mark.parametrize(("policy", "columns"), [("roundgate", 5), ("sglang-delayer", 11)])
def test_the_gathered_row_counts_the_policys_columns(policy: str, columns: int) -> None:
    assert gather_columns(policy, 8) == columns


@pytest.mark.parametrize(
    "key",
    cases(*ALL_GATHER_SAMPLES),
)
def test_gather_cost_from_an_all_gather_sample(key: str, tmp_path: Path) -> None:
    out = tmp_path / "costs.json"
    log = sample_path(key)
    argv = ["calibrate", "--nccl-log", str(log), "--dp-size", "8", "--policy", "sglang-delayer"]
    assert main([*argv, "--base", "gb200-dsv3", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    # The latency at 8 ranks x 11 int64 columns, read off the measured curve.
    expected = interpolate_time_us(parse(log.read_text()), 8 * 11 * 8) / 1000
    assert written["gather_ms"] == pytest.approx(expected, abs=1e-6)
    assert written["_source"]["nccl"]["bytes"] == 704
    costs = load_costs(str(out), out.read_text())
    assert costs.gather_ms == written["gather_ms"]
    assert costs.decode_base_ms == load_costs("gb200-dsv3").decode_base_ms


@pytest.mark.parametrize(
    "key",
    cases("repo:allreduce_2host_ok.txt", "repo:allreduce_8gpu_wrong.txt", "shared:sample_2.txt"),
)
def test_an_all_reduce_log_is_refused_naming_the_flag(key: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["calibrate", "--nccl-log", str(sample_path(key))])
    assert "--nccl-log" in capsys.readouterr().err


def test_round_costs_from_a_scrape(tmp_path: Path) -> None:
    text = scrape([0.030, 0.032, 0.034], [0.250, 0.270])
    totals = kind_totals(text)
    assert totals["decode"].rounds == 3 and totals["decode"].seconds == pytest.approx(0.096)
    assert totals["extend"].rounds == 2 and totals["extend"].seconds == pytest.approx(0.52)
    path = tmp_path / "scrape.txt"
    path.write_text(text)
    out = tmp_path / "c.json"
    assert main(["calibrate", "--metrics", str(path), "--out", str(out)]) == 0
    costs = load_costs(str(out), out.read_text())
    # One scrape without work counters: a decode round costs the measured decode round, an
    # extend round the measured one.
    assert costs.rank_ms(100, 0) == pytest.approx(32.0)
    assert costs.group_ms([costs.rank_ms(100, 1000)], True) == pytest.approx(260.0)


def test_several_runs_recover_the_per_sequence_and_per_token_costs(tmp_path: Path) -> None:
    truth = {
        "decode_base_ms": 40.0,
        "decode_per_seq_ms": 12.0,
        "prefill_per_token_ms": 3.5,
        "extend_overhead_ms": 0.0,
    }
    # Three loads: light (small batches, lone prompts), medium, heavy (big batches, prompts
    # arriving together), as a gated and an ungated run of one deployment would show.
    loads = [
        ([1, 1, 2, 1], [(0, 256), (1, 256)]),
        ([3, 4, 4, 5], [(3, 256), (4, 512)]),
        ([8, 9, 10, 12], [(8, 512), (10, 512), (9, 256)]),
    ]
    argv = ["calibrate"]
    for i, (decodes, prompts) in enumerate(loads):
        path = tmp_path / f"run{i}.prom"
        path.write_text(priced_scrape(truth, decodes, prompts))
        argv += ["--metrics", str(path)]
    out = tmp_path / "c.json"
    assert main([*argv, "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    for name, value in truth.items():
        assert written[name] == pytest.approx(value, abs=1e-3), name
    assert written["_source"]["metrics"]["equations"] == 6


def test_a_baseline_scrape_is_subtracted(tmp_path: Path) -> None:
    # One process's counters: 10 decode rounds of 20 ms and 10 extend rounds of 520 ms before
    # the run, then the run's own 5 of each (20 ms and 120 ms).
    earlier_decode, earlier_extend = [0.020] * 10, [0.520] * 10
    before, after = tmp_path / "before.prom", tmp_path / "after.prom"
    before.write_text(scrape(earlier_decode, earlier_extend))
    after.write_text(scrape(earlier_decode + [0.020] * 5, earlier_extend + [0.120] * 5))
    out = tmp_path / "c.json"
    argv = ["calibrate", "--metrics", str(after), "--metrics-baseline", str(before)]
    assert main([*argv, "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["_source"]["metrics"]["extend_rounds"] == 5
    assert written["decode_base_ms"] == pytest.approx(20.0)
    assert written["extend_overhead_ms"] == pytest.approx(100.0)


def test_a_replaced_groups_lingering_series_do_not_count(tmp_path: Path) -> None:
    # Redeployed between the scrapes: the old group's series were still in the "before" scrape
    # (the hub had not dropped them yet) and are gone "after"; only the new group ran.
    old_group = scrape([0.5] * 100, [2.0] * 10, group="old")
    new_before = scrape([], [], group="new")
    before, after = tmp_path / "before.prom", tmp_path / "after.prom"
    before.write_text(old_group + new_before)
    after.write_text(scrape([0.030] * 4, [0.250] * 2, group="new"))
    out = tmp_path / "c.json"
    argv = ["calibrate", "--metrics", str(after), "--metrics-baseline", str(before)]
    assert main([*argv, "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["_source"]["metrics"]["decode_rounds"] == 4
    assert written["decode_base_ms"] == pytest.approx(30.0)
    assert written["extend_overhead_ms"] == pytest.approx(220.0)


def test_a_baseline_from_after_the_run_is_refused(tmp_path: Path, capsys) -> None:
    small, big = tmp_path / "small.prom", tmp_path / "big.prom"
    small.write_text(scrape([0.03], [0.2]))
    big.write_text(scrape([0.03] * 3, [0.2] * 3))
    with pytest.raises(SystemExit):
        main(["calibrate", "--metrics", str(small), "--metrics-baseline", str(big)])
    assert "--metrics-baseline" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not a scrape {{{", "--metrics"),
        (None, "no extend rounds"),
    ],
)
def test_bad_scrapes_are_refused_naming_the_flag(text, message, tmp_path: Path, capsys) -> None:
    path = tmp_path / "s.txt"
    path.write_text(scrape([0.03], []) if text is None else text)
    with pytest.raises(SystemExit):
        main(["calibrate", "--metrics", str(path)])
    assert message in capsys.readouterr().err


def test_nothing_to_calibrate_from_is_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["calibrate"])
    assert "--nccl-log" in capsys.readouterr().err
