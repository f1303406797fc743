"""The regimes as named scenarios (``--scenario long-prefill-chunked|bursty``) and the regime
report that tells a healthy run from a LOW one."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest

from roundgate.actors.control.round import RoundKind
from roundgate.cli.main import main
from roundgate.sim.records import KIND_CODES, SimResult, Timeline
from roundgate.sim.regime_report import regime_report
from roundgate.sim.regimes import REGIMES, UniformPrompts

IDLE, DECODE, PREFILL = (
    KIND_CODES[k] for k in (RoundKind.IDLE, RoundKind.DECODE, RoundKind.PREFILL)
)


def test_long_prefill_prompts_fall_in_20k_to_60k_with_256_outputs() -> None:
    regime = REGIMES["long-prefill-chunked"]
    arrivals = regime.arrivals(num_requests=500, seed=3)
    assert len(arrivals) == 500
    assert all(20_000 <= a.prompt_tokens <= 60_000 for a in arrivals)
    assert all(a.output_tokens == 256 for a in arrivals)
    lengths = [a.prompt_tokens for a in arrivals]
    assert min(lengths) < 25_000 and max(lengths) > 55_000  # spread over the range
    assert regime.arrivals(num_requests=500, seed=3) == arrivals  # seeded
    assert regime.concurrency == 32 and regime.engine["max_scheduled_tokens"] == 16384


def test_bursty_regime_sends_in_bursts() -> None:
    regime = REGIMES["bursty"]
    arrivals = regime.arrivals(num_requests=96)
    burst = regime.workload.burst_size
    times = [a.time_s for a in arrivals]
    assert len(set(times)) == 96 // burst
    assert all(len({times[i] for i in range(j, j + burst)}) == 1 for j in range(0, 96, burst))


def test_uniform_prompts_refuse_an_empty_range() -> None:
    with pytest.raises(ValueError, match="empty"):
        UniformPrompts(4, 60_000, 20_000, 256)


def run_of(rounds: list[tuple[list[int], list[int]]], round_s: float = 0.5) -> SimResult:
    """A run of ``dp`` ranks from its rounds: (each rank's kind, each rank's prompt tokens)."""
    tl = Timeline()
    for i, (kinds, tokens) in enumerate(rounds):
        tl.start_s.append(i * round_s)
        tl.duration_ms.append(round_s * 1000)
        tl.kinds.extend(kinds)
        tl.prefill_tokens.extend(tokens)
    dp = len(rounds[0][0])
    duration = len(rounds) * round_s
    return SimResult("x", dp, duration, len(rounds), len(rounds), 0, 0, [], array("d"), tl, 0)


CHUNK = 1000
D, P, I = DECODE, PREFILL, IDLE  # noqa: E741


def test_regime_report_passes_an_aligned_run() -> None:
    """Every rank prefills in the same rounds, then the group decodes: healthy."""
    window = ([P, P, P, P], [CHUNK] * 4)
    decode = ([D, D, D, D], [0] * 4)
    report = regime_report(run_of([window, window, decode, decode, decode] * 6), CHUNK)
    assert report.verdict == "healthy" and not report.is_low
    assert report.mixed_rounds == 0 and report.aligned_share == 1.0
    assert report.windows == 6 and report.windows_per_s == pytest.approx(6 / 15)
    assert report.mean_window_s == 1.0  # two 0.5 s rounds
    assert report.window_fill == 1.0
    assert report.progress_spread_chunks == 0.0
    assert report.input_tokens_per_s == pytest.approx(12 * 4 * CHUNK / 15)


def test_regime_report_flags_a_run_that_stays_mixed() -> None:
    """One rank at a time is mid-prompt, the others decode and wait: the group never leaves
    prefill, progress drifts apart by chunks, and the verdict is LOW."""
    rounds = []
    for i in range(30):
        kinds, tokens = [D, D, D, D], [0] * 4
        kinds[i % 4 if i % 8 < 4 else 0] = P
        tokens[i % 4 if i % 8 < 4 else 0] = CHUNK
        rounds.append((kinds, tokens))
    report = regime_report(run_of(rounds), CHUNK)
    assert report.verdict == "LOW" and report.is_low
    assert report.mixed_rounds == report.extend_rounds == 30
    assert report.aligned_share == 0.25 and report.window_fill == 0.25
    assert report.windows == 1  # one long window: the group never returns to decode
    assert report.mean_window_s == 15.0
    assert report.progress_spread_chunks > 1.0
    assert max(report.rank_prefill_tokens_per_s) > 2 * min(report.rank_prefill_tokens_per_s)


def test_mixed_rounds_in_short_windows_are_not_low() -> None:
    """A gate's ANY point opens for the ranks with prompts only: mixed, but brief."""
    window = ([P, D, D, D], [CHUNK, 0, 0, 0])
    decode = ([D, D, D, D], [0] * 4)
    report = regime_report(run_of([window, decode, decode, decode] * 8), CHUNK)
    assert report.mixed_fraction == 1.0 and report.mean_window_s == 0.5
    assert report.verdict == "healthy"


def test_idle_ranks_do_not_make_a_round_mixed() -> None:
    """A rank with nothing to run waits for nobody's chunk."""
    report = regime_report(run_of([([P, P, I, I], [CHUNK, CHUNK, 0, 0])] * 4), CHUNK)
    assert report.mixed_rounds == 0 and report.aligned_share == 1.0 and not report.is_low


def test_regime_report_needs_a_timeline() -> None:
    with pytest.raises(ValueError, match="timeline"):
        regime_report(SimResult("x", 2, 1.0, 1, 1, 0, 1, [], array("d"), None, 0), CHUNK)


def test_simulate_runs_a_regime_with_goodput_and_its_report(tmp_path: Path, capsys) -> None:
    path = tmp_path / "regime.json"
    argv = ["simulate", "--scenario", "long-prefill-chunked", "--scenario-requests", "16"]
    argv += ["--compare", "none,roundgate", "--json", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "goodput (TTFT <= 30000 ms and ITL p99 <= 3000 ms):" in out and "regime:" in out
    report = json.loads(path.read_text())
    assert set(report["results"]) == {"none", "roundgate"}
    for arm in report["results"].values():
        assert arm["requests"] == 16 and arm["unfinished"] == 0
        assert arm["regime"]["verdict"] in ("healthy", "LOW")
        assert arm["goodput"]["slo"] == {"ttft_ms": 30000.0, "itl_ms": 3000.0}
        assert arm["regime"]["input_tokens_per_s"] > 0


def test_an_unknown_scenario_lists_the_regimes(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--scenario", "nope"])
    err = capsys.readouterr().err
    assert "long-prefill-chunked" in err and "bursty" in err and "vllm-44558" in err


def test_simulate_prints_a_regime_report_for_any_run(tmp_path: Path, capsys) -> None:
    path = tmp_path / "sim.json"
    argv = ["simulate", "--dp-size", "2", "--max-num-seqs", "16", "--num-kv-pages", "128"]
    argv += ["--page-size", "16", "--num-requests", "24", "--rate", "50", "--input-len", "64"]
    argv += ["--output-len", "6", "--no-progress", "--compare", "roundgate,none"]
    assert main([*argv, "--regime-report", "--json", str(path)]) == 0
    assert "regime:" in capsys.readouterr().out
    report = json.loads(path.read_text())
    assert set(report["regime"]) == {"roundgate", "none"}
    assert all(r["verdict"] in ("healthy", "LOW") for r in report["regime"].values())
