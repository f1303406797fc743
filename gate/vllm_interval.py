"""vLLM's ``--prefill-schedule-interval N`` (DP > 1), re-implemented over our rows.

Only the step clock is shared: every rank counts the same rounds (idle "dummy" rounds too) and
resets when a wave ends, so ``step_counter % N`` agrees everywhere. Whether a rank then defers
is its own decision: it defers only with a running decode to protect and while it is not
``capacity_bound`` (its queue did not drain the last time it admitted). That per-rank part is
the documented exception to "identical on every rank".

Mapping onto one gather per round: vLLM's wave ends after a global idleness check (every 32
steps); here a wave ends on a round whose gathered rows are all idle, the same signal our gate
uses. The rank's waiting-queue length after admission comes from its own published row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roundgate.gate.policy import RoundByRound
from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.spec import PolicyContext, PolicySpec
from roundgate.gate.vote import GateVote

COLUMNS = ("waiting",)


@dataclass(frozen=True)
class VllmIntervalConfig:
    interval: int = field(
        default=1,
        metadata={
            "flag": "prefill_schedule_interval",
            "help": "vllm-interval: admit fresh prefill on every N-th step only (1 = off); "
            "simulate defaults to 2, the setting of vLLM's PR",
            "sim_default": 2,
        },
    )

    def __post_init__(self) -> None:
        value = self.interval
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"--prefill-schedule-interval must be an integer >= 1, got {value!r}")


_ADMIT = GateVote(True, None, reason="admit")
_DEFER = GateVote(False, None, reason="defer")


class VllmInterval(RoundByRound):
    """Throttle fresh prefill to every N-th step on ranks that have decodes running."""

    extra_columns: tuple[str, ...] = COLUMNS

    def __init__(self, interval: int = 1, rank: int = 0) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(
                f"--prefill-schedule-interval must be an integer >= 1, got {interval!r}"
            )
        self.interval = interval
        self.rank = rank
        self.step_counter = 0
        self.capacity_bound = False
        self._deferred = False

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        """``defer = throttle and not capacity_bound and a decode is running on this rank``.

        ``local`` is the rank's fresh probe (``has_decode_work``); without it, the rank's own
        row of last round stands in.
        """
        throttle = self.interval > 1 and self.step_counter % self.interval != 0
        decoding = local.has_decode_work if local is not None else rows[self.rank].has_decode_work
        self._deferred = throttle and not self.capacity_bound and decoding
        return _DEFER if self._deferred else _ADMIT

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        """Saturation guard from this rank's row, then advance (or reset) the shared clock."""
        if not self._deferred:
            self.capacity_bound = rows[self.rank].extras[0] > 0
        if view.all_idle:
            self.step_counter = 0  # the wave ended: the next one starts aligned
        else:
            self.step_counter += 1


def _build(config: VllmIntervalConfig, ctx: PolicyContext) -> VllmInterval:
    return VllmInterval(config.interval, ctx.rank)


POLICY = PolicySpec(
    name="vllm-interval",
    summary="vLLM's --prefill-schedule-interval: a shared step clock, plus the rank's own state",
    config=VllmIntervalConfig,
    build=_build,
)
