"""The steady-state window (sim/steady.py): where it opens and closes, what it says about a
group that keeps up and one that does not, and that its figures are the run's own samples."""

from __future__ import annotations

import numpy as np
import pytest
from sim_builders import make_spec, sim_args

from roundgate.sim.records import SimResult
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import RouterSpec
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.steady import describe, itl_times, steady_report, window_of


def run(rate: float, num_requests: int = 400, fast: bool = True) -> SimResult:
    """dp=2 on the Hopper preset, 100-token prompts, 20-token outputs (capacity ~45 req/s)."""
    spec = make_spec(num_requests=num_requests, rate=rate, input_len=100, output_len=20)
    return simulate(
        SimSpec(
            sim_args("none", dp_size=2),
            spec,
            PRESETS["h100-dsv3"],
            RouterSpec("round-robin"),
            keep_timeline=not fast,
        )
    )


@pytest.mark.parametrize(
    ("rate", "steady"), [(10.0, True), (400.0, False)], ids=["keeps-up", "overloaded"]
)
def test_a_group_is_steady_only_while_it_keeps_up(rate: float, steady: bool) -> None:
    result = run(rate)
    window = window_of(result)
    assert window is not None and window.steady is steady
    sends = sorted(r.arrival_s for r in result.records)
    assert window.start_s >= sends[int(0.2 * len(sends))] and window.end_s == sends[-1]
    if steady:
        assert window.throughput_rps == pytest.approx(window.offered_rps, rel=0.1)
    else:
        assert window.queue_growth_rps > 0.5 * window.offered_rps
        assert "NOT steady" in describe(steady_report(result))


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "full-rounds"])
def test_each_itl_sample_is_dated_inside_its_request_life(fast: bool) -> None:
    result = run(10.0, num_requests=120, fast=fast)
    at = itl_times(result)
    assert len(at) == len(result.itl_ms) > 0
    assert np.all(np.diff(at) >= 0)  # recorded in time order
    first = min(r.first_token_s for r in result.records)
    last = max(r.last_token_s for r in result.records)
    assert first < at[0] and at[-1] == pytest.approx(last)


def test_the_window_figures_come_from_the_window_and_the_series_cover_the_run() -> None:
    result = run(10.0)
    report = steady_report(result)
    window, figures, series = report["window"], report["figures"], report["series"]
    inside = [r for r in result.records if window["start_s"] <= r.arrival_s <= window["end_s"]]
    ttft = [(r.first_token_s - r.arrival_s) * 1000 for r in inside]
    assert figures["ttft_ms"]["mean"] == pytest.approx(np.mean(ttft), rel=1e-3)
    assert series["t_s"][-1] == pytest.approx(result.duration_s, abs=1e-2)
    sent = sum(series["sent_rps"]) * (series["t_s"][1] - series["t_s"][0])
    assert sent == pytest.approx(len(result.records), rel=1e-2)  # rates kept to 3 decimals
    assert series["in_system"][-1] == 0 and max(series["in_system"]) > 0


def test_a_run_too_short_has_no_window() -> None:
    report = steady_report(run(10.0, num_requests=5))
    assert report["window"] is None and report["figures"] is None
    assert describe(report) == "no steady-state window (too few requests)"
