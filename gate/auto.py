"""``roundgate-auto``: the group gate whose intervals come from what the group measures.

The fixed gate asks an operator for two intervals, and the right ones differ ~10x between
workloads. This gate derives its openings from three things every rank reads alike from the
gathered rows, with defaults meant to be left alone:

- **Keep decode rounds the common case** (``--prefill-auto-hold-rounds``, 2). A stream's ITL
  percentiles are judged over its gaps, one per round. With two decode rounds for every
  window, under a third of any stream's gaps are extend rounds, so its ITL median is a decode
  round's; holding longer only moves its mean, while every held prompt pays for it in TTFT.
  Where a window's fixed cost dwarfs a decode round (an extend overhead of 140-215 ms beside a
  10-30 ms decode round), the hold is also at least the decode rounds that cost as much as
  that fixed part of the measured step, so windows never take most of the group's time.
  The pace is a credit (a token bucket of extend rounds: one round of credit per busy round,
  ``hold + 1`` per window), so a quiet spell banks a little and a burst after it is not held.
- **Align prompts when that is free.** When every rank that decodes also holds a prompt (the
  ALL point), one window serves them all and nobody's decodes wait on another rank's lone
  extend: the gate opens.
- **Price a prompt's wait against its own prefill** (``--prefill-auto-wait-ratio``, 0.5). Short
  of ALL, a window costs every running decode of the group the extend step while only some
  ranks extend. A prompt whose prefill takes 55 ms gains nothing by waiting 500 ms for the
  other ranks, but one whose prefill takes six seconds (chunk after chunk) loses little by
  waiting a second for the others to join its window, and the group then runs its chunk rounds
  together instead of "mixed". So a rank's oldest held prompt may wait ``ratio`` times its own
  prefill time, measured (``roundgate.gate.prefill_cost``: the step fitted online from round
  lengths), before the gate opens for it.
- **Ration slow windows against the SLO** (``--prefill-auto-itl-slo-ms`` 200,
  ``--prefill-auto-ttft-slo-ms`` 2000). A window whose round would outlast the ITL bound
  (the decode round plus the step of the largest backlog) gives every running stream a slow
  gap, and a stream meets an ITL p99 bound only while under 1 % of its gaps are slow: with
  many long streams running (reasoning), windows must be rare. Such a window waits until the
  oldest prompt has used three quarters of its TTFT slack (the TTFT bound less its own
  prefill), so each one carries as many prompts as the TTFT bound allows, or until one slow
  window in ``100 / yield`` decode rounds (a stream gets ``yield`` gaps a decode round, and
  may have one slow gap in a hundred), whichever comes first.
- **Price speculative decoding** (``roundgate.gate.decode_yield``). With drafts a decode
  round is a verify round: its cost is what the round lengths measure, and the tokens it
  yields a request (kept drafts + 1) come from the ranks' running totals of kept drafts (the
  ``spec_accepted`` column). The yield spaces slow windows (above); the drafts a decode
  feeds are taken off an extending rank's ``num_tokens`` so the step is fitted on prompt
  tokens only. Without drafts the yield is 1 and nothing changes.
- **Finish a slow run at once.** When the extend rounds just run (measured, plus the last
  one estimated) already outlast the ITL bound, the streams of the ranks that extend have
  their slow gap: extending again next round lengthens that one gap, while a decode round in
  between would give them a second. So the run goes on while the ranks that still want to
  extend hold more of the group's decodes than the rest (or nobody decodes yet: a burst into
  an idle group) and the run stays within the TTFT bound. A burst that fills every rank's
  batch at once then prefills as ``none`` would, instead of in slow rounds one decode apart.
- **Liveness** (``--prefill-max-wait-ms``): whatever the estimates say, no prompt waits longer,
  but for the one round that keeps two windows apart. A rank's prompts queue behind its own
  chunked prefill, so under a steady stream of long prompts some held prompt is always past the
  bound; granting it the round right after a window would run windows back to back every
  round, and every stream of a rank that extends in both sees one gap of two chunk rounds
  while its decodes starve (the long-prefill regime past saturation lost a third of its
  goodput so).

An idle group (no rank decodes) has nothing to protect: the gate opens at once. Every input is
a gathered row or state derived from gathered rows, so every rank votes the same.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roundgate.gate.decode_yield import DecodeYield
from roundgate.gate.policy import RoundByRound
from roundgate.gate.prefill_cost import PrefillCost
from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.spec import PolicyContext, PolicySpec
from roundgate.gate.vote import CLOSED, GateVote

COLUMNS = ("head_tokens", "head_wait_rounds", "now_ms", "backlog_tokens", "spec_accepted")
_TOKENS, _HEAD, _NOW, _BACKLOG, _ACCEPTED = range(len(COLUMNS))
# Round start times remembered (ms): enough to date the oldest prompt the liveness bound allows.
_HISTORY = 4096
# Windows of credit the gate may bank in quiet spells. Two let a burst that lands over a few
# rounds take two windows back to back, instead of one merged extend round long enough to break
# every running stream's ITL p99; under steady arrivals the credit never builds up, and the
# hold above sets the pace.
_BURST = 2
# Share of a prompt's TTFT slack (the SLO less its own prefill) a slow window may hold it:
# the rest is left for queueing behind the window and for the cost estimate's error.
_THETA = 0.75
# A stream meets an ITL p99 bound while at most one of its gaps in this many is slow.
_GAPS_PER_SLOW = 100


@dataclass(frozen=True)
class AutoGateConfig:
    """The adaptive gate's flags; the defaults are the product, not a starting point."""

    hold_rounds: int = field(
        default=2,
        metadata={
            "flag": "prefill_auto_hold_rounds",
            "help": "roundgate-auto: decode rounds kept between prefill windows",
        },
    )
    wait_ratio: float = field(
        default=0.5,
        metadata={
            "flag": "prefill_auto_wait_ratio",
            "help": "roundgate-auto: a held prompt may wait this fraction of its own measured "
            "prefill time for the other ranks to join its window",
        },
    )
    ttft_slo_ms: float = field(
        default=2000.0,
        metadata={
            "flag": "prefill_auto_ttft_slo_ms",
            "help": "roundgate-auto: the TTFT a prompt should meet; a slow window may hold "
            "prompts for part of the slack it leaves",
        },
    )
    itl_slo_ms: float = field(
        default=200.0,
        metadata={
            "flag": "prefill_auto_itl_slo_ms",
            "help": "roundgate-auto: the ITL p99 a stream should meet; a window whose round "
            "would be longer is a slow window, rationed",
        },
    )
    max_wait_ms: float = field(
        default=10_000.0,
        metadata={
            "flag": "prefill_max_wait_ms",
            "help": "roundgate-auto: liveness bound; no prompt waits longer for the gate",
        },
    )

    def __post_init__(self) -> None:
        hold = self.hold_rounds
        if isinstance(hold, bool) or not isinstance(hold, int) or hold < 0:
            raise ValueError(f"--prefill-auto-hold-rounds must be an integer >= 0, got {hold!r}")
        for flag, value in (
            ("--prefill-auto-wait-ratio", self.wait_ratio),
            ("--prefill-max-wait-ms", self.max_wait_ms),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{flag} must be a number >= 0, got {value!r}")
        for flag, value in (
            ("--prefill-auto-ttft-slo-ms", self.ttft_slo_ms),
            ("--prefill-auto-itl-slo-ms", self.itl_slo_ms),
            ("--prefill-max-wait-ms", self.max_wait_ms),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{flag} must be a number > 0, got {value!r}")


_VOTES = {
    reason: GateVote(True, "all" if reason in ("all", "idle") else "any", reason=reason)
    for reason in ("all", "idle", "budget", "liveness")
}


class AutoGate(RoundByRound):
    """The gate of the module docstring: hold, ALL, priced waits, liveness."""

    extra_columns: tuple[str, ...] = COLUMNS

    def __init__(self, config: AutoGateConfig) -> None:
        self.config = config
        self.cost = PrefillCost()
        self.yield_ = DecodeYield()
        self.since_prefill = 0  # rounds since the last round with an extend
        # Extend-round credit, in rounds: one per busy round, ``_pace()`` per window, capped.
        self.credit = _BURST * (config.hold_rounds + 1)
        # Never two windows back to back (unless no hold is asked for, or to finish a run that
        # is slow already): a rank that extends in both runs none of its decodes in either,
        # and its streams see one gap of two extend rounds, which is what breaks an ITL p99
        # bound when prompts are long.
        self._gap = min(1, config.hold_rounds)
        self._starts: deque[int] = deque(maxlen=_HISTORY)  # round start times, ms
        self._last: tuple[int, int] | None = None  # (start ms, longest extend) of last round
        self._run_start: int | None = None  # start (ms) of the current run of extend rounds
        self._last_round_ms = 0.0  # the run's last round, estimated (inf: nothing learned yet)

    @property
    def rounds_since_prefill(self) -> int:
        return self.since_prefill

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        wanting = [row for row in rows if row.wants_prefill]
        if not wanting:
            return CLOSED
        if not any(row.has_decode_work for row in rows):
            return _VOTES["idle"]
        all_point = not any(row.has_decode_work and not row.wants_prefill for row in rows)
        now = max(row.extras[_NOW] for row in rows)
        if self._continues(rows, wanting, now):
            return _VOTES["all" if all_point else "budget"]
        if self.since_prefill < self._gap:
            return CLOSED  # never two windows back to back, not even for liveness
        ages = [self._age_ms(row.extras[_HEAD], now) for row in wanting]
        if max(ages) >= self.config.max_wait_ms:
            return _VOTES["liveness"]
        if self.credit < self._pace():
            return CLOSED
        if all_point:
            return _VOTES["all"]
        cfg = self.config
        step = self.cost.step_ms
        window_ms = (self.cost.decode_ms or 0.0) + step(max(r.extras[_BACKLOG] for r in wanting))
        slow = window_ms > cfg.itl_slo_ms
        spacing = self._slow_spacing_ms() if slow else 0.0
        for row, age in zip(wanting, ages, strict=True):
            own = step(row.extras[_TOKENS])
            budget = cfg.wait_ratio * own
            if slow:
                budget = max(budget, min(_THETA * (cfg.ttft_slo_ms - own), spacing))
            if age >= budget:
                return _VOTES["budget"]
        return CLOSED

    def _continues(self, rows: Sequence[RankRow], wanting: Sequence[RankRow], now: int) -> bool:
        """Whether the run of extend rounds that ended with the last gathered round goes on."""
        if self.since_prefill or self._run_start is None:
            return False
        cfg = self.config
        run = now - self._run_start  # the run's rounds before the last gathered one, measured
        last = self._last_round_ms
        if last != math.inf:
            run += last
            if run <= cfg.itl_slo_ms:
                return False
        if run > cfg.ttft_slo_ms:
            return False
        spared = sum(row.batch_size - row.num_extends for row in wanting)
        streams = sum(row.batch_size - row.num_extends for row in rows)
        return streams == 0 or 2 * spared > streams

    def _pace(self) -> int:
        """Extend-round credit a window costs: the hold plus the window itself; the hold at
        least the decode rounds that cost as much as a window's fixed part."""
        hold = self.config.hold_rounds
        decode = self.cost.decode_ms
        if decode and self.cost.known:
            hold = max(hold, math.ceil(self.cost.step_ms(0) / decode))
        return hold + 1

    def _slow_spacing_ms(self) -> float:
        """How far apart slow windows keep every stream within its ITL p99 bound: a stream
        yields ``tokens_per_decode`` gaps a decode round and may have one slow gap in
        ``_GAPS_PER_SLOW``, so one slow window every ``_GAPS_PER_SLOW / yield`` decode rounds."""
        rounds = _GAPS_PER_SLOW / self.yield_.tokens_per_decode
        return rounds * (self.cost.decode_ms or 0.0)

    def _age_ms(self, head_rounds: int, now: int) -> float:
        """How long ago (ms) the round ``head_rounds`` before the last gathered one began."""
        starts = self._starts
        if head_rounds <= 0 or not starts:
            return 0.0
        index = max(0, len(starts) - 1 - head_rounds)
        return float(now - starts[index])

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        if view.all_idle:
            # An idle gap: nothing is held, and the next round's start is not this one's end.
            self._last = None
            self._run_start = None
            self.since_prefill = 0
            return
        self.since_prefill = 0 if view.any_extend else self.since_prefill + 1
        pace = self._pace()
        spent = pace if view.any_extend else 0
        # Floored at zero: a window the pace did not grant (idle, liveness) restarts the pace
        # rather than putting it in debt.
        self.credit = max(0, min(_BURST * pace, self.credit - spent + 1))
        now = max(row.extras[_NOW] for row in rows)
        self.yield_.add_round(rows, sum(row.extras[_ACCEPTED] for row in rows))
        if self._last is not None:
            start, tokens = self._last
            self.cost.add_round(float(now - start), tokens)
        tokens = self.yield_.extend_tokens(rows) if view.any_extend else 0
        self._last = (now, tokens)
        if not tokens:
            self._run_start = None
        else:
            if self._run_start is None:
                self._run_start = now
            known = self.cost.known and self.cost.decode_ms is not None
            self._last_round_ms = (
                self.cost.decode_ms + self.cost.step_ms(tokens) if known else math.inf
            )
        self._starts.append(now)


def _build(config: AutoGateConfig, ctx: PolicyContext) -> AutoGate:
    return AutoGate(config)


POLICY = PolicySpec(
    name="roundgate-auto",
    summary="the group gate with measured intervals: decode rounds kept, ALL when free, "
    "waits priced against each prompt's own prefill",
    config=AutoGateConfig,
    build=_build,
)
