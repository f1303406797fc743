"""``roundgate calibrate``: a --costs file from the shared nccl-tests samples and a scrape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from actors.telemetry.metrics import RankMetricSet
from deployment.cli import main
from deployment.sim.calibration import gather_columns, round_means
from deployment.sim.round_costs import load_costs
from kernels.nccl_tests import interpolate_time_us, parse

CANDIDATES = [
    Path(__file__).resolve().parents[2] / "shared" / "nccl-tests-samples",
    Path("/work/shared/nccl-tests-samples"),
]
SAMPLES = next((p for p in CANDIDATES if p.is_dir()), None)
needs_samples = pytest.mark.skipif(SAMPLES is None, reason="nccl-tests samples not found")


def scrape(decode_s: list[float], extend_s: list[float]) -> str:
    """A real exposition of the engine's metrics with these group rounds recorded."""
    metrics = RankMetricSet()
    for kind, values in (("decode", decode_s), ("extend", extend_s)):
        child = metrics.group_round_time.labels("g0", "m", kind)
        for value in values:
            child.observe(value)
    return generate_latest(metrics.registry).decode()


@pytest.mark.parametrize(("policy", "columns"), [("roundgate", 5), ("sglang-delayer", 11)])
def test_the_gathered_row_counts_the_policys_columns(policy: str, columns: int) -> None:
    assert gather_columns(policy, 8) == columns


@needs_samples
@pytest.mark.parametrize("sample", ["sample_1.txt", "sample_5.txt"])
def test_gather_cost_from_an_all_gather_sample(sample: str, tmp_path: Path) -> None:
    out = tmp_path / "costs.json"
    log = SAMPLES / sample
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


@needs_samples
def test_an_all_reduce_log_is_refused_naming_the_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["calibrate", "--nccl-log", str(SAMPLES / "sample_2.txt")])
    assert "--nccl-log" in capsys.readouterr().err


def test_round_costs_from_a_scrape(tmp_path: Path) -> None:
    text = scrape([0.030, 0.032, 0.034], [0.250, 0.270])
    means = round_means(text)
    assert means.decode_ms == pytest.approx(32.0)
    assert means.extend_ms == pytest.approx(260.0)
    path = tmp_path / "scrape.txt"
    path.write_text(text)
    out = tmp_path / "c.json"
    assert main(["calibrate", "--metrics", str(path), "--out", str(out)]) == 0
    costs = load_costs(str(out), out.read_text())
    # A decode round costs the measured decode round, an extend round the measured one.
    assert costs.rank_ms(100, 0) == pytest.approx(32.0)
    assert costs.group_ms([costs.rank_ms(100, 1000)], True) == pytest.approx(260.0)


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
