"""The calibration test: the gb200-dsv3 preset reproduces vLLM PR #44558's workload A.

The scenario replays both arms (interval 1 = no policy, interval 2 = ``vllm-interval`` with
its capacity-bound guard) on the preset and compares every published figure: ±20 % on each,
±35 % on P99 TTFT (docs/cost-model.md section 5 gives each term's source or fit), and the
interval's effect, each figure's ratio of the arms, within 35 % of the published one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from sim import cli as sim_cli
from sim.scenarios import SCENARIOS, replay


@pytest.fixture(scope="module")
def replayed():
    return replay("vllm-44558")


def test_every_figure_within_its_tolerance(replayed) -> None:
    rows, _ = replayed
    assert len(rows) == 12
    for row in rows:
        assert row.tolerance == (0.35 if row.figure == "ttft_p99_ms" else 0.20), row
        assert row.within, f"{row.arm} {row.figure}: {row.simulated} vs {row.published}"


def test_the_interval_has_the_published_effect(replayed) -> None:
    rows, _ = replayed
    by = {(r.arm, r.figure): r for r in rows}
    for figure in ("itl_p50_ms", "itl_mean_ms", "tpot_mean_ms", "ttft_mean_ms", "ttft_p99_ms"):
        base, new = by["interval 1", figure], by["interval 2", figure]
        published = new.published / base.published
        simulated = new.simulated / base.simulated
        # Same direction, and the ratio of the arms within 35 % of the published ratio.
        assert simulated < 1, figure
        assert abs(simulated / published - 1) <= 0.35, (figure, simulated, published)


def test_the_cli_prints_and_writes_every_figure(
    replayed, tmp_path: Path, capsys, monkeypatch
) -> None:
    # The replay itself is the fixture's (one run of the scenario per test session).
    monkeypatch.setattr(sim_cli, "replay", lambda *args, **kwargs: replayed)
    out = tmp_path / "s.json"
    assert main(["simulate", "--scenario", "vllm-44558", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "published" in text and "P50 ITL (ms)" in text and "%" in text
    report = json.loads(out.read_text())
    assert len(report["figures"]) == 12
    for summary in report["results"].values():
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
        assert summary["requests_per_s"] > 0


def test_an_unknown_scenario_is_refused_naming_the_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--scenario", "vllm-0"])
    assert "--scenario" in capsys.readouterr().err
    assert "vllm-44558" in SCENARIOS
