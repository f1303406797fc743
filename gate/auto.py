"""``roundgate-auto``: the group gate, opening when the group's own measurements say so.

The gate's ALL/ANY points stay (the ANY interval is still the hard admission bound); on top,
the gate opens early from what the gathered rows show:

- **TTFT budget** (``--prefill-max-wait-ms``): the oldest held prompt of any rank would pass
  the budget if the gate waited one more round (its age, plus the measured cost of the
  extend round it would then run in).
- **Amortized** (decode vs extend cost): a prefill round costs every running decode of the
  group the difference between an extend round and a decode round; holding costs each held
  prompt the time it waits. Opening when the time the held prompts have waited reaches the
  time the opening costs the decodes is the rule that minimises their sum over a
  cycle (the economic-order-quantity argument: the held cost grows as the square of the
  interval, the opening cost is paid once per interval).
- **Saturation guard**: when an open round could not drain the backlog (a rank still wants
  prefill after extending, or its backlog needs more than one round's token budget), holding
  only adds waiting: the gate stays open until the backlog fits one round again.

Round costs come from the shared clock (``now_ms``, the max over ranks of each rank's clock,
in the rows) between consecutive rounds, split by whether the rows showed an extend. Every
input is a gathered row or state derived from gathered rows, so every rank votes the same.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gate.delay import PrefillDelay
from gate.group_gate import GroupGate
from gate.policy import RoundByRound
from gate.rows import RankRow, RoundView
from gate.spec import PolicyContext, PolicySpec
from gate.vote import GateVote

COLUMNS = ("backlog_requests", "backlog_rounds", "head_wait_rounds", "now_ms")
_REQ, _ROUNDS, _HEAD, _NOW = range(len(COLUMNS))
# Round start times remembered (ms): enough to date the oldest prompt the ANY bound allows.
_HISTORY = 4096
# Weight of a round-cost estimate's newest sample (exponential moving average).
_EWMA = 0.2


@dataclass(frozen=True)
class AutoGateConfig:
    """The adaptive gate's flags: its two bounds and the TTFT budget."""

    attempt_interval: int = field(
        default=4,
        metadata={
            "flag": "prefill_auto_attempt_interval",
            "help": "roundgate-auto: rounds between ALL attempt points",
        },
    )
    any_interval: int = field(
        default=16,
        metadata={
            "flag": "prefill_auto_any_interval",
            "help": "roundgate-auto: rounds between ANY attempt points (the admission bound)",
        },
    )
    max_wait_ms: float = field(
        default=500.0,
        metadata={
            "flag": "prefill_max_wait_ms",
            "help": "roundgate-auto: TTFT budget; no prompt waits longer for the gate",
        },
    )

    def __post_init__(self) -> None:
        for flag, value in (
            ("--prefill-auto-attempt-interval", self.attempt_interval),
            ("--prefill-auto-any-interval", self.any_interval),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag} must be an integer >= 1, got {value!r}")
        if self.any_interval < self.attempt_interval:
            raise ValueError(
                f"--prefill-auto-any-interval ({self.any_interval}) must be >= "
                f"--prefill-auto-attempt-interval ({self.attempt_interval})"
            )
        wait = self.max_wait_ms
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait > 0:
            raise ValueError(f"--prefill-max-wait-ms must be a number > 0, got {wait!r}")


_OPEN = {reason: GateVote(True, "any", reason=reason) for reason in ("budget", "amortized")}
_SATURATED = GateVote(True, "any", reason="saturated")


class AutoGate(RoundByRound):
    """The group gate plus the three early openings above (see the module docstring)."""

    extra_columns: tuple[str, ...] = COLUMNS

    def __init__(self, config: AutoGateConfig) -> None:
        self.config = config
        self.gate = GroupGate(PrefillDelay(config.attempt_interval, config.any_interval))
        self.decode_ms: float | None = None  # measured decode-only round
        self.extend_ms: float | None = None  # measured round with an extend
        self.saturated = False
        self._starts: deque[int] = deque(maxlen=_HISTORY)  # round start times, ms
        self._last: tuple[int, bool] | None = None  # (start ms, extended) of the last round

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        wanting = [row for row in rows if row.wants_prefill]
        if not wanting:
            return self.gate.vote(rows)
        if self.saturated:
            return _SATURATED
        decode = self.decode_ms or 0.0
        extend = self.extend_ms if self.extend_ms is not None else 2 * decode
        now = max(row.extras[_NOW] for row in rows)
        oldest = max(self._age_ms(row.extras[_HEAD], now) for row in wanting)
        if oldest + decode + extend >= self.config.max_wait_ms:
            return _OPEN["budget"]
        vote = self.gate.vote(rows)
        if vote.open:
            return vote
        # Held time so far (each rank's held prompts, about half its head's age on average)
        # against what one opening costs the group's running decodes.
        held = sum(row.extras[_REQ] * self._age_ms(row.extras[_HEAD], now) / 2 for row in wanting)
        decodes = sum(row.batch_size - row.num_extends for row in rows)
        if held >= (extend - decode) * decodes:
            return _OPEN["amortized"]
        return vote

    def _age_ms(self, head_rounds: int, now: int) -> float:
        """How long ago (ms) the round ``head_rounds`` before the last gathered one began."""
        starts = self._starts
        if head_rounds <= 0 or not starts:
            return 0.0
        index = max(0, len(starts) - 1 - head_rounds)
        return float(now - starts[index])

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        self.gate.observe(rows, view)
        if view.all_idle:
            # An idle gap: nothing is held, and the next round's start is not this one's end.
            self._last = None
            self.saturated = False
            return
        now = max(row.extras[_NOW] for row in rows)
        if self._last is not None:
            start, extended = self._last
            duration = float(now - start)
            if duration > 0:
                if extended:
                    self.extend_ms = _average(self.extend_ms, duration)
                else:
                    self.decode_ms = _average(self.decode_ms, duration)
        self._last = (now, view.any_extend)
        self._starts.append(now)
        # The guard: an open round left backlog behind, or some backlog needs several rounds.
        left_behind = view.any_extend and any(row.num_extends and row.wants_prefill for row in rows)
        # One prompt longer than a round's budget is not saturation: it is chunked anyway.
        too_big = any(row.extras[_ROUNDS] > 1 and row.extras[_REQ] > 1 for row in rows)
        if left_behind or too_big:
            self.saturated = True
        elif not any(row.wants_prefill for row in rows):
            self.saturated = False


def _average(old: float | None, sample: float) -> float:
    return sample if old is None else old + _EWMA * (sample - old)


def _build(config: AutoGateConfig, ctx: PolicyContext) -> AutoGate:
    return AutoGate(config)


POLICY = PolicySpec(
    name="roundgate-auto",
    summary="the group gate, opening early on a TTFT budget, measured round costs and saturation",
    config=AutoGateConfig,
    build=_build,
)
