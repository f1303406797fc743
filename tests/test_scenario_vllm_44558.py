"""The calibration test: the gb200-dsv3 preset reproduces vLLM PR #44558's workload A.

The scenario replays both arms (interval 1 = no policy, interval 2 = ``vllm-interval`` with
its capacity-bound guard) on the preset and compares every published figure: ±20 % on each,
±35 % on P99 TTFT (docs/cost-model.md section 5 gives each term's source or fit), and the
interval's effect, each figure's ratio of the arms, within 35 % of the published one. The PR
does not state its run length, so the figures are checked at 2,000, 3,000 (the scenario's)
and 6,000 requests: an agreement that held at one length only would be a property of it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from roundgate.cli.main import main
from roundgate.sim import cli as sim_cli
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.scenarios import SCENARIOS, replay

LENGTHS = (2000, 3000, 6000)


@pytest.fixture(scope="module", params=LENGTHS, ids=[f"{n}-requests" for n in LENGTHS])
def replayed(request):
    return request.param, *replay("vllm-44558", num_requests=request.param)


def test_every_figure_within_its_tolerance(replayed) -> None:
    _, rows, _ = replayed
    assert len(rows) == 12
    for row in rows:
        assert row.tolerance == (0.35 if row.figure == "ttft_p99_ms" else 0.20), row
        assert row.within, f"{row.arm} {row.figure}: {row.simulated} vs {row.published}"
        assert row.verdict == "ok"


def test_the_interval_has_the_published_effect(replayed) -> None:
    _, rows, _ = replayed
    by = {(r.arm, r.figure): r for r in rows}
    for figure in ("itl_p50_ms", "itl_mean_ms", "tpot_mean_ms", "ttft_mean_ms", "ttft_p99_ms"):
        base, new = by["interval 1", figure], by["interval 2", figure]
        published = new.published / base.published
        simulated = new.simulated / base.simulated
        # Same direction, and the ratio of the arms within 35 % of the published ratio.
        assert simulated < 1, figure
        assert abs(simulated / published - 1) <= 0.35, (figure, simulated, published)


def test_each_arm_reports_its_steady_state(replayed) -> None:
    length, rows, summaries = replayed
    for summary in summaries.values():
        steady = summary["steady_state"]
        window, series = steady["window"], steady["series"]
        assert 0 < window["start_s"] < window["end_s"] < summary["duration_s"]
        assert window["offered_rps"] == pytest.approx(24.0, rel=0.05)
        assert len(series["t_s"]) == len(series["in_system"]) == len(series["waiting"]) == 60
        assert max(series["in_system"]) > 0 and series["in_system"][-1] == 0
        assert summary["collections"] > 0
        # Interval 1's requests live ~55 s (200 rounds of ~270 ms): a 3,000-request run is
        # hardly longer than its filling; by 6,000 both arms keep up with the offered rate.
        if length == 6000 or summary["policy"] == "vllm-interval":
            assert window["steady"], (length, window)
            # The window drops the drain: what finishes in it is near the offered rate, and
            # above the whole run's throughput.
            assert window["throughput_rps"] > summary["requests_per_s"]
    # The window's figures sit beside the run's; the drain's 32 ms rounds are out of them.
    for row in rows:
        assert row.steady is not None
    by = {(r.arm, r.figure): r for r in rows}
    assert by["interval 1", "itl_mean_ms"].steady > by["interval 1", "itl_mean_ms"].simulated


def test_the_cli_states_stability_and_run_length_and_writes_every_figure(
    replayed, tmp_path: Path, capsys, monkeypatch
) -> None:
    # The replay itself is the fixture's (one run of the scenario per length).
    monkeypatch.setattr(sim_cli, "replay", lambda *args, **kwargs: replayed[1:])
    out = tmp_path / "s.json"
    argv = ["simulate", "--scenario", "vllm-44558", "--json", str(out), "--plot", str(tmp_path)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "published" in text and "P50 ITL (ms)" in text and "%" in text
    assert "published run: stable" in text and "run length: 3,000 requests" in text
    assert "interval 1: window" in text and "req/s offered" in text
    assert (tmp_path / "vllm-44558_steady.png").stat().st_size > 10_000
    report = json.loads(out.read_text())
    assert len(report["figures"]) == 12
    assert report["published_stability"].startswith("stable")
    for summary in report["results"].values():
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
        assert summary["requests_per_s"] > 0
        assert set(summary["steady_state"]) == {"window", "figures", "series"}


def test_an_unknown_scenario_is_refused_naming_the_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--scenario", "vllm-0"])
    assert "--scenario" in capsys.readouterr().err
    assert "vllm-44558" in SCENARIOS


def test_a_run_length_too_short_is_refused_naming_the_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--scenario", "vllm-44558", "--scenario-requests", "3"])
    assert "--scenario-requests must be >= 10" in capsys.readouterr().err


def test_a_cost_flag_overrides_the_scenarios_own_preset(monkeypatch, capsys) -> None:
    seen = {}

    def fake_replay(name, costs, num_requests, seed):
        seen["costs"] = costs
        return [], {}

    monkeypatch.setattr(sim_cli, "replay", fake_replay)
    assert main(["simulate", "--scenario", "vllm-44558", "--extend-overhead-ms", "200"]) == 0
    preset = PRESETS["gb200-dsv3"]
    assert seen["costs"] == dataclasses.replace(preset, extend_overhead_ms=200.0)
    assert "costs gb200-dsv3 with overrides" in capsys.readouterr().out
