"""The regime of a group, live: the gate's outcome, mixed rounds, windows, prefill progress.

A group's rounds are read here exactly as ``sim/regime_report.py`` reads a simulated timeline
(both through ``gate/outcome.py``), so an operator can tell a healthy group from a LOW one
(SGLang #35241: ranks out of step, some rank always mid-prompt) from ``/metrics`` alone.
These series are group-level: only the group's exporting rank (rank 0) records them.
"""

from __future__ import annotations

from collections.abc import Sequence

from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.telemetry.metrics import RankMetricSet
from roundgate.gate.outcome import (
    OUTCOMES,
    ProgressBins,
    any_wants,
    gate_outcome,
    is_mixed,
    prefill_tokens,
    rank_kinds,
)
from roundgate.gate.rows import RankRow


class RegimeMetrics:
    """One group's regime series, updated once per group round (a few counter updates; a
    pass over the rows only in rounds with prefill, or to learn what the vote read)."""

    def __init__(self, metrics: RankMetricSet, group: str, model: str) -> None:
        s = self.set = metrics
        g = self._group = (group, model)
        # Bound children for the outcomes every policy can produce; a policy's own reasons
        # are bound when first seen.
        self._outcomes = {o: s.gate_rounds.labels(*g, o) for o in OUTCOMES}
        self._mixed = s.mixed_rounds.labels(*g)
        self._windows = s.prefill_windows.labels(*g)
        self._spread = s.progress_spread.labels(*g)
        self._bins = s.progress_bins.labels(*g)
        self._bin_spread = s.progress_bin_spread.labels(*g)
        self._progress: ProgressBins | None = None
        # Last round's rows: what this round's vote read (``RankLoop.last_rows``).
        self._voted_rows: Sequence[RankRow] = ()
        self._was_extending = False

    def observe(self, outcome: RoundOutcome, clock_s: float, chunk_tokens: int) -> None:
        """Record one group round; ``clock_s`` is the round's boundary (its gather) on a
        monotonic clock, ``chunk_tokens`` the round's token budget (a chunk)."""
        rows, vote = outcome.rows, outcome.vote
        any_extend = outcome.view.any_extend
        label = gate_outcome(vote, not any_extend and any_wants(self._voted_rows), any_extend)
        counter = self._outcomes.get(label)
        if counter is None:
            counter = self._outcomes[label] = self.set.gate_rounds.labels(*self._group, label)
        counter.inc()
        self._voted_rows = rows
        progress = self._progress
        if progress is None or len(progress.tokens) != len(rows):  # first round, new epoch
            progress = self._progress = ProgressBins(len(rows))
        bins, spread_sum = progress.active_bins, progress.spread_sum
        if progress.roll(clock_s):
            self._spread.set(progress.last_spread / chunk_tokens)
            if progress.active_bins > bins:
                self._bins.inc()
                self._bin_spread.inc((progress.spread_sum - spread_sum) / chunk_tokens)
        if any_extend:
            if is_mixed(*rank_kinds(rows)):
                self._mixed.inc()
            if not self._was_extending:
                self._windows.inc()
            progress.add(clock_s, [prefill_tokens(row) for row in rows])
        self._was_extending = any_extend
