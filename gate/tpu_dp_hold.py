"""TPU inference's DP batch prefill (``DP_SCHED_BATCH_PREFILL``, PRs #2577, #2651, #2656).

TPU inference's DP scheduler holds each new request in one buffer in front of the ranks and
dispatches the whole buffer together when ``dp_size`` requests have arrived, when
``DP_SCHED_BATCH_PREFILL_FLUSH_TIMEOUT_MS`` (30 s) have passed since the last flush, or when
at least as many ranks were idle in the previous step as requests are held (so a quiet group
never waits). Once dispatched, a request is an ordinary request of its rank: its rank admits it
as soon as it can, and chunked prefill continues unhindered.

Here a request is routed to its rank on arrival, so "held in the buffer" becomes "held in its
rank's queue": the group's buffer is the sum over ranks of queued prompts not yet dispatched,
read from the gathered ``waiting`` column. On a flush every rank opens for one round. What a
rank could not admit in that round (its batch or token budget ran out) stays *dispatched*
(``owed``): the rank keeps admitting it on later rounds without waiting for another batch, as
TPU's rank scheduler would, and it does not count toward the next batch. Owed counts shrink
with the rank's queue (FIFO: dispatched prompts are at its head). Prompts that reach a queue in
the flush round itself count as dispatched too; a rank with owed prompts may admit one that
queued behind them (the scheduler admits what fits).

The flush timeout is measured on the shared clock (``now_ms``, the max over ranks of each
rank's clock, in the rows), so every rank flushes on the same round. Every input is a gathered
row or state derived from gathered rows, so the decision is identical on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roundgate.gate.policy import RoundByRound
from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.spec import PolicyContext, PolicySpec
from roundgate.gate.vote import GateVote

COLUMNS = ("waiting", "now_ms")
_WAIT, _NOW = range(len(COLUMNS))


@dataclass(frozen=True)
class TpuDpHoldConfig:
    """TPU inference's one knob (flag ``--tpu-dp-hold-flush-timeout-ms``)."""

    flush_timeout_ms: float = field(
        default=30000.0,
        metadata={
            "help": "tpu-dp-hold: flush the held prompts this long after the last flush even "
            "if fewer than dp_size arrived (DP_SCHED_BATCH_PREFILL_FLUSH_TIMEOUT_MS)"
        },
    )

    def __post_init__(self) -> None:
        if not self.flush_timeout_ms > 0:
            raise ValueError(
                f"--tpu-dp-hold-flush-timeout-ms must be > 0, got {self.flush_timeout_ms}"
            )


FLUSH_REASONS = ("batch", "timeout", "idle")
_FLUSH = {reason: GateVote(True, None, reason=reason) for reason in FLUSH_REASONS}
_OWED = GateVote(True, None, reason="owed")  # admitting prompts an earlier flush dispatched
# Held in the buffer; a resident chunk belongs to a dispatched request and keeps running.
_HOLD = GateVote(False, None, chunks=True, reason="hold")


class TpuDpHold(RoundByRound):
    """Hold new prompts until ``dp_size`` are held across the group (or the flush timeout, or
    enough idle ranks), then let every rank admit them on the same round."""

    extra_columns: tuple[str, ...] = COLUMNS

    def __init__(self, config: TpuDpHoldConfig, dp_size: int, rank: int = 0) -> None:
        self.config = config
        self.rank = rank
        self.threshold = max(1, dp_size)  # TPU flushes at dp_size held requests
        self.owed: tuple[int, ...] = ()  # per rank: queued prompts already dispatched
        self.last_flush_ms: int | None = None  # the shared clock of the last flush
        self.flushes = 0
        self._flushed = False  # this round's vote flushed: the rows that follow set ``owed``

    def held(self, rows: Sequence[RankRow]) -> int:
        """Prompts in the group's buffer: queued on their ranks, not yet dispatched."""
        owed = self.owed or (0,) * len(rows)
        return sum(max(0, row.extras[_WAIT] - o) for row, o in zip(rows, owed, strict=True))

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        now = max(row.extras[_NOW] for row in rows)
        if self.last_flush_ms is None and now > 0:
            self.last_flush_ms = now  # TPU's clock starts with the scheduler; ours at the
            # first published rows (the loop's placeholder rows before them carry 0)
        self._flushed = False
        reason = self._flush_reason(rows, now)
        if reason is not None:
            self._flushed = True
            self.flushes += 1
            self.last_flush_ms = now
            return _FLUSH[reason]
        if self.owed and self.owed[self.rank] > 0:
            return _OWED
        return _HOLD

    def _flush_reason(self, rows: Sequence[RankRow], now: int) -> str | None:
        """Why the buffer flushes this round (TPU's ``_try_flush_pending``), else None."""
        held = self.held(rows)
        if held == 0:
            return None
        if held >= self.threshold:
            return "batch"
        last = self.last_flush_ms
        if last is not None and now - last >= self.config.flush_timeout_ms:
            return "timeout"
        idle = sum(1 for row in rows if row.num_tokens == 0 and row.batch_size == 0)
        if idle >= held:
            return "idle"  # the idle ranks take them at once without piling up
        return None

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        """Queued prompts after a flush round were dispatched; later, a rank's owed count can
        only shrink with its queue."""
        waiting = tuple(row.extras[_WAIT] for row in rows)
        if self._flushed:
            self.owed = waiting
        elif self.owed:
            self.owed = tuple(min(o, w) for o, w in zip(self.owed, waiting, strict=True))
        self._flushed = False


def _build(config: TpuDpHoldConfig, ctx: PolicyContext) -> TpuDpHold:
    return TpuDpHold(config, ctx.dp_size, ctx.rank)


POLICY = PolicySpec(
    name="tpu-dp-hold",
    summary="TPU inference's DP batch prefill: hold new prompts until dp_size have arrived",
    config=TpuDpHoldConfig,
    build=_build,
    flag_prefix="tpu_dp_hold_",
)
