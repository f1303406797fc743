"""The gate's outcome per round, mixed rounds and prefill progress (gate/outcome.py), and the
live series that count them (actors/telemetry/regime_metrics.py) agreeing with the
simulator's regime report (sim/regime_report.py) on the same rounds."""

from __future__ import annotations

import itertools
import random
from array import array
from dataclasses import dataclass

import pytest
from builders import make_args, make_loops, make_request
from prometheus_client.parser import text_string_to_metric_families

from roundgate.actors.control.rank_loop import RankLoop, RoundParts
from roundgate.actors.control.round import RoundKind
from roundgate.actors.telemetry.metrics_hub import merge, render, snapshot
from roundgate.actors.telemetry.rank_metrics import RankMetrics
from roundgate.gate import registry
from roundgate.gate.outcome import (
    OUTCOMES,
    ProgressBins,
    gate_outcome,
    is_mixed,
    prefill_tokens,
    rank_kinds,
)
from roundgate.gate.rows import RankRow
from roundgate.gate.vote import GateVote
from roundgate.sim.records import KIND_CODES, SimResult, Timeline
from roundgate.sim.regime_report import regime_report

ALL_OPEN, ANY_OPEN = GateVote(True, "all"), GateVote(True, "any")
ALL_HELD, ANY_HELD, HELD = GateVote(False, "all"), GateVote(False, "any"), GateVote(False, None)
OPEN = GateVote(True, None)
BUDGET = GateVote(True, "any", reason="budget")  # roundgate-auto's early opening
NO_WAIT = GateVote(True, None, reason="no_wait")  # SGLang's delayer
DELAY = GateVote(False, None, chunks=True, reason="delay")  # a hold that lets chunks run


@pytest.mark.parametrize(
    ("vote", "wanted", "any_extend", "outcome"),
    [
        (ALL_OPEN, True, True, "all"),
        (ALL_OPEN, False, True, "all"),  # a prompt reaching an idle group at its ALL point
        (ANY_OPEN, True, True, "any"),
        (OPEN, True, True, "open"),
        (BUDGET, True, True, "budget"),  # a reason names the opening before its point
        (NO_WAIT, False, True, "no_wait"),
        (ALL_OPEN, True, False, "empty"),
        (ANY_OPEN, True, False, "empty"),
        (NO_WAIT, True, False, "empty"),
        (ALL_HELD, True, False, "closed"),
        (ANY_HELD, True, False, "closed"),
        (HELD, True, False, "closed"),
        (DELAY, True, True, "partial"),
        (HELD, False, True, "partial"),
        (ALL_OPEN, False, False, "no_demand"),  # an idle group's ALL point
        (ALL_HELD, False, False, "no_demand"),  # plain decode rounds
        (DELAY, False, False, "no_demand"),
    ],
)
def test_gate_outcome_table(vote: GateVote, wanted: bool, any_extend: bool, outcome: str) -> None:
    assert gate_outcome(vote, wanted, any_extend) == outcome


# A rank's row for each round kind, as RankLoop publishes a plan of that kind.
KIND_ROWS = {
    RoundKind.IDLE: RankRow(0, 0, 0, False, False),
    RoundKind.DECODE: RankRow(3, 3, 0, True, True),
    RoundKind.PREFILL: RankRow(16, 1, 1, False, False),
    RoundKind.MIXED: RankRow(18, 4, 2, True, True),
}


@pytest.mark.parametrize("kinds", list(itertools.product(KIND_ROWS, repeat=3)))
def test_rank_kinds_and_mixed_read_rows_as_the_regime_report_reads_kinds(
    kinds: tuple[RoundKind, ...],
) -> None:
    codes = [KIND_CODES[k] for k in kinds]
    # sim/regime_report.py's reading of one round of the timeline.
    decoding = codes.count(KIND_CODES[RoundKind.DECODE])
    extending = len(codes) - decoding - codes.count(KIND_CODES[RoundKind.IDLE])
    assert rank_kinds([KIND_ROWS[k] for k in kinds]) == (extending, decoding)
    assert is_mixed(extending, decoding) == (extending > 0 and decoding > 0)


@pytest.mark.parametrize(
    ("extending", "decoding", "mixed"),
    [(0, 0, False), (0, 3, False), (2, 0, False), (1, 1, True), (3, 5, True)],
)
def test_is_mixed_table(extending: int, decoding: int, mixed: bool) -> None:
    assert is_mixed(extending, decoding) is mixed


@pytest.mark.parametrize(
    ("row", "tokens"),
    [
        (RankRow(0, 0, 0, False, False), 0),  # idle
        (RankRow(5, 5, 0, False, True), 0),  # five decodes
        (RankRow(100, 1, 1, False, False), 100),  # one chunk
        (RankRow(105, 6, 1, True, True), 100),  # a chunk beside five decodes
        (RankRow(37, 4, 2, False, True), 35),  # two chunks, two decodes
    ],
)
def test_prefill_tokens_are_tokens_less_one_per_decode(row: RankRow, tokens: int) -> None:
    assert prefill_tokens(row) == tokens


def bins_of(rounds: list[tuple[float, list[int]]]) -> ProgressBins:
    progress = ProgressBins(len(rounds[0][1]), bin_s=5.0)
    for t, tokens in rounds:
        progress.add(t, tokens)
    return progress


@pytest.mark.parametrize(
    ("rounds", "active_bins", "spread_sum", "last_spread"),
    [
        # One bin, still open: nothing closed yet.
        ([(0.0, [10, 0]), (1.0, [0, 4])], 0, 0, 0),
        # Bin 0 (10 vs 4: spread 6) closed by a round in bin 1.
        ([(0.0, [10, 0]), (1.0, [0, 4]), (5.0, [0, 0])], 1, 6, 6),
        # Bin 0 had no prefill: closed, not counted, last spread 0.
        ([(0.0, [0, 0]), (7.0, [3, 3])], 0, 0, 0),
        # Bins 0 (spread 8) and 1 (spread 2) counted; closed into bin 2.
        ([(0.5, [8, 0]), (5.5, [2, 4]), (10.0, [0, 0])], 2, 10, 2),
        # A gap: bin 0 counted, but the bin before the clock's saw no round: last spread 0.
        ([(0.0, [8, 0]), (20.0, [0, 0])], 1, 8, 0),
    ],
)
def test_progress_bins_table(
    rounds: list[tuple[float, list[int]]], active_bins: int, spread_sum: int, last_spread: int
) -> None:
    progress = bins_of(rounds)
    assert progress.active_bins == active_bins
    assert progress.spread_sum == spread_sum
    assert progress.last_spread == last_spread
    assert progress.mean_spread == (spread_sum / active_bins if active_bins else 0.0)


def test_roll_closes_a_bin_only_when_the_clock_leaves_it() -> None:
    progress = ProgressBins(2)
    assert [progress.roll(t) for t in (0.0, 4.9, 5.0, 5.1, 9.99, 30.0)] == [
        False,  # the first bin opens
        False,
        True,
        False,
        False,
        True,
    ]


def reference_spread(rounds: list[tuple[float, list[int]]], dp: int) -> float:
    """The regime report's spread before it shared ProgressBins: every bin in a list."""
    bins: list[list[int]] = []
    for start, tokens in rounds:
        b = int(start // 5.0)
        while len(bins) <= b:
            bins.append([0] * dp)
        for rank, n in enumerate(tokens):
            bins[b][rank] += n
    active = [row for row in bins if any(row)]
    return sum(max(row) - min(row) for row in active) / len(active) if active else 0.0


@pytest.mark.parametrize("seed", range(8))
def test_progress_bins_mean_is_the_regime_reports_spread(seed: int) -> None:
    rng = random.Random(seed)
    dp = rng.randint(1, 6)
    t, rounds = 0.0, []
    for _ in range(rng.randint(1, 400)):
        t += rng.choice((0.01, 0.3, 1.7, 12.0))
        tokens = [rng.choice((0, 0, 0, 16, 512, 4096)) for _ in range(dp)]
        rounds.append((t, tokens))
    progress = bins_of(rounds)
    progress.close()
    assert progress.mean_spread == reference_spread(rounds, dp)


@pytest.mark.parametrize(("num_ranks", "bin_s"), [(0, 5.0), (2, 0.0), (2, -1.0)])
def test_progress_bins_refuse_bad_shapes(num_ranks: int, bin_s: float) -> None:
    with pytest.raises(ValueError, match=r"num_ranks|bin_s"):
        ProgressBins(num_ranks, bin_s)


# --- the live series over a driven group ------------------------------------------------

DP = 3
ROUND_S = 0.7  # the group's clock per round: 5 s bins close every 7-8 rounds
# (round, rank, prompt tokens): staggered arrivals so ranks prefill out of step.
ARRIVALS = [(0, 0, 40), (3, 1, 12), (4, 2, 30), (9, 0, 8), (15, 1, 50), (16, 2, 6), (30, 0, 20)]
GAUGE = "roundgate_prefill_progress_spread_chunks"
GROUP_LABELS = {"group": "g0", "model": "m"}


@dataclass
class Run:
    """A driven group: its recorders, its rounds as the simulator records them, the
    per-round value of the spread gauge, and the chunk (``--max-scheduled-tokens``)."""

    recorders: list[RankMetrics]
    result: SimResult
    gauge: list[float]
    chunk: int


def drive(policy: str, gap_s: float = 10.0, mixed_batches: bool = False) -> Run:
    """A dp=3 group run round by round until every request finished, with RankMetrics on
    every rank and the rounds recorded as sim/simulator.py records its timeline. One idle
    round ``gap_s`` after the last ends the run, so the live side closes its last 5 s bin as
    the report does at the end of the run. ``mixed_batches``: decodes and prefill chunks in
    one batch (``--enable-mixed-prefill-decode``)."""
    args = make_args(DP, policy, enable_mixed_prefill_decode=mixed_batches)
    loops: list[RankLoop] = make_loops(args)
    recorders = [RankMetrics("g0", "m", rank) for rank in range(DP)]
    tl, gauge = Timeline(), []
    clock, i, finished = 0.0, 0, False
    while not finished:
        for at, rank, length in ARRIVALS:
            if at == i:
                loops[rank].scheduler.add_request(
                    make_request(f"r{at}-{rank}", prompt_len=length, max_tokens=6)
                )
        busy = i <= ARRIVALS[-1][0] or any(loop.scheduler.has_unfinished for loop in loops)
        finished = not busy
        clock = clock + gap_s if finished else i * ROUND_S
        rows = [loop.begin() for loop in loops]
        outcomes = [loop.finish(rows) for loop in loops]
        parts = RoundParts(gathered_at=clock)
        for loop, rec, outcome in zip(loops, recorders, outcomes, strict=True):
            rec.observe(outcome, loop.scheduler, parts, loop.policy.rounds_since_prefill)
        gauge.append(recorders[0].set.registry.get_sample_value(GAUGE, GROUP_LABELS))
        tl.start_s.append(clock)
        tl.duration_ms.append(ROUND_S * 1000)
        tl.kinds.extend(KIND_CODES[o.plan.kind] for o in outcomes)
        tl.prefill_tokens.extend(o.plan.num_prefill_tokens for o in outcomes)
        i += 1
        assert i < 500, "the group never went idle"
    result = SimResult(policy, DP, clock + ROUND_S, i, 0, 0, 0, [], array("d"), tl, 0)
    return Run(recorders, result, gauge, args.max_scheduled_tokens)


def scrape(recorders: list[RankMetrics]) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted labels: value}} of the merged exposition (the hub's)."""
    text = render(merge(snapshot(r.set.registry) for r in recorders)).decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def group_value(vals: dict, name: str) -> float:
    (value,) = vals[name].values()  # one series for the one group: rank 0's
    return value


def outcomes_of(vals: dict) -> dict[str, float]:
    return {dict(k)["outcome"]: v for k, v in vals["roundgate_gate_rounds_total"].items()}


@pytest.mark.parametrize("policy", registry.names())
def test_outcomes_sum_to_the_group_rounds_and_openings_to_the_prefill_rounds(policy: str) -> None:
    vals = scrape(drive(policy).recorders)
    outcomes = outcomes_of(vals)
    assert set(OUTCOMES) <= outcomes.keys()  # exported from the start, zeros included
    assert sum(outcomes.values()) == group_value(vals, "roundgate_group_rounds_total")
    ran = sum(v for o, v in outcomes.items() if o not in ("closed", "empty", "no_demand"))
    assert ran == group_value(vals, "roundgate_prefill_rounds_total") > 0
    mixed = group_value(vals, "roundgate_mixed_rounds_total")
    windows = group_value(vals, "roundgate_prefill_windows_total")
    assert 0 <= mixed <= ran and 1 <= windows <= ran


def test_the_fixed_gates_openings_are_its_admitted_windows() -> None:
    vals = scrape(drive("roundgate").recorders)
    outcomes = outcomes_of(vals)
    admitted = {
        dict(k)["point"]: v for k, v in vals["roundgate_gate_windows_admitted_total"].items()
    }
    assert outcomes["all"] == admitted["all"] > 0
    assert outcomes["any"] == admitted["any"]
    assert outcomes["partial"] == outcomes["open"] == 0  # the gate holds chunks too
    assert outcomes["closed"] > 0  # staggered prompts waited for an attempt point


@pytest.mark.parametrize("mixed_batches", [False, True])
@pytest.mark.parametrize("policy", ["roundgate", "none", "sglang-delayer"])
def test_live_series_agree_with_the_regime_report(policy: str, mixed_batches: bool) -> None:
    run = drive(policy, mixed_batches=mixed_batches)
    result, vals = run.result, scrape(run.recorders)
    report = regime_report(result, run.chunk)
    assert report.extend_rounds == group_value(vals, "roundgate_prefill_rounds_total")
    assert report.mixed_rounds == group_value(vals, "roundgate_mixed_rounds_total")
    assert report.mixed_rounds > 0  # staggered prompts: some rank extends alone
    assert report.windows == group_value(vals, "roundgate_prefill_windows_total")
    bins = group_value(vals, "roundgate_prefill_progress_bins_total")
    spread = group_value(vals, "roundgate_prefill_progress_bin_spread_chunks_total")
    assert bins >= 2
    assert report.progress_spread_chunks == round(spread / bins, 3)
    # Each rank's prefill progress: the prompt tokens of its own plans.
    per_rank = {
        dict(k)["dp_rank"]: v for k, v in vals["roundgate_rank_prefill_tokens_total"].items()
    }
    tokens = result.timeline.prefill_tokens
    assert per_rank == {str(r): float(sum(tokens[r::DP])) for r in range(DP)}
    assert sum(per_rank.values()) == sum(length for _, _, length in ARRIVALS)


@pytest.mark.parametrize("gap_s", [ROUND_S, 5.0, 20.0])
def test_spread_gauge_is_the_last_closed_bins_spread_in_chunks(gap_s: float) -> None:
    run = drive("roundgate", gap_s)
    tl = run.result.timeline
    progress, expected = ProgressBins(DP), []
    for i, start in enumerate(tl.start_s):
        progress.add(start, tl.prefill_tokens[i * DP : (i + 1) * DP])
        expected.append(progress.last_spread / run.chunk)
    assert run.gauge == expected
    assert max(run.gauge) > 0  # the staggered prompts split the ranks' progress
