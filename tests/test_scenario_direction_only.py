"""Replays that check direction only say so, with how far off the magnitude is.

``trtllm-blog10`` states too little of its setup to reproduce its absolute throughput (client
count, batch limits, GPUs a rank): the replay holds only the direction of the balance's
effect. Its output must never read as a plain "ok" beside a -79 % figure.
"""

from __future__ import annotations

import dataclasses

import pytest

from roundgate.cli.main import main
from roundgate.sim import cli as sim_cli
from roundgate.sim.scenarios import FigureRow, replay


@pytest.fixture(scope="module")
def trtllm():
    # Two waves of the 256 clients instead of the scenario's four: the same words, half the
    # time (`roundgate simulate --scenario trtllm-blog10` prints the full run's -79 % / -81 %).
    return replay("trtllm-blog10", num_requests=512)


def test_every_row_says_direction_only_and_the_magnitude_error(trtllm) -> None:
    rows, _ = trtllm
    assert [r.arm for r in rows] == ["baseline", "ADP balance"]
    for row in rows:
        assert row.direction_only
        assert row.error < -0.5  # the absolute throughput is far off: it must say so
        assert row.verdict == f"direction only, magnitude off by {row.error * 100:+.0f} %"
    balance = rows[1]
    assert balance.published_change > 1 and balance.simulated_change > 1.02


def test_the_cli_prints_the_words_not_ok(trtllm, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sim_cli, "replay", lambda *args, **kwargs: trtllm)
    assert main(["simulate", "--scenario", "trtllm-blog10"]) == 0
    table = capsys.readouterr().out.split("\n")
    figure_lines = [line for line in table if "output (tok/s)" in line]
    assert len(figure_lines) == 2
    for line in figure_lines:
        assert "direction only, magnitude off by -" in line
        assert not line.rstrip().endswith(" ok")


@pytest.mark.parametrize(
    ("published_change", "simulated_change", "verdict"),
    [
        (1.33, 1.20, "direction only, magnitude off by -50 %"),
        (1.33, 0.90, "MISS: direction wrong (direction only, magnitude off by -50 %)"),
        (1.33, 1.01, "MISS: direction wrong (direction only, magnitude off by -50 %)"),
    ],
)
def test_a_direction_only_row_reads(
    published_change: float, simulated_change: float, verdict: str
) -> None:
    row = FigureRow("arm", "output_tps", 100.0, 50.0, 0.2, published_change, simulated_change)
    row = dataclasses.replace(row, direction_only=True)
    assert row.verdict == verdict
