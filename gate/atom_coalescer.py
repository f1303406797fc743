"""ROCm ATOM's prefill coalescer (PR #1611, ``ATOM_PREFILL_DELAYER_*``), re-implemented.

ATOM reduces a few integers per tick with one ``all_reduce(SUM)`` and every rank computes the
same FIRE/HOLD: must-fire bounds first (no decode anywhere, KV pressure, the TTFT cap, a held
partial's deadline), then an alignment gate (hold while some rank has no prefill), then the
goal (fire once the group's pending tokens fill ``target_fill`` of the prefillable ranks'
token budget: Nagle's algorithm for prefill), then a stall give-up (the pending total stopped
growing for ``stall_ticks`` ticks: waiting longer buys nothing). All bounds count ticks, so
no rank's clock can disagree with another's.

Here the SUM rides the round's one gather as columns (``prefillable``, ``pending_permille``:
pending tokens capped at the budget in thousandths of it, ``gen_requests``, ``kv_permille``,
``backlog_requests`` and ``waiting``, whose difference is the rank's resident chunks), and the
decision reads last round's rows. As for SGLang's delayer (``roundgate.gate.sglang_delayer``), a
rank admits on a FIRE only what its own row published as prefillable: a prompt that arrived after
the rank published is published first and decided on next round, as ATOM decides on it with
the fresh reduce. Without that, "nobody prefillable → FIRE" would admit every scattered prompt
at once and the coalescer would be ``none``. A HOLD stops resident chunks too: ATOM's admission
gate covers resuming a partial, which is why a partial has its own, tighter deadline.

Left out: ATOM's later additions (``MAX_QUEUE_MS``, the post-prefill decode interval of
#2238) and the one-time FIRE of the very first tick (it meets an idle group here, which fires
anyway).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roundgate.gate.policy import RoundByRound
from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.spec import PolicyContext, PolicySpec
from roundgate.gate.vote import GateVote

COLUMNS = (
    "prefillable",
    "pending_permille",
    "gen_requests",
    "kv_permille",
    "backlog_requests",
    "waiting",
)
_PF, _PENDING, _GEN, _KV, _BACKLOG, _WAIT = range(len(COLUMNS))


@dataclass(frozen=True)
class AtomCoalescerConfig:
    """ATOM's knobs with the defaults of PR #1611 (flags ``--atom-coalescer-*``)."""

    target_fill: float = field(
        default=0.7,
        metadata={
            "help": "atom-coalescer: fire once pending tokens fill this share of the "
            "prefillable ranks' token budget (0..1]"
        },
    )
    ttft_max_ticks: int = field(
        default=30, metadata={"help": "atom-coalescer: rounds a hold may last (the TTFT cap)"}
    )
    partial_max_ticks: int = field(
        default=8,
        metadata={"help": "atom-coalescer: rounds a hold may last while a rank is mid-chunk"},
    )
    stall_ticks: int = field(
        default=3,
        metadata={
            "help": "atom-coalescer: fire after this many rounds without the pending total growing"
        },
    )
    kv_high_watermark: float = field(
        default=0.9,
        metadata={"help": "atom-coalescer: fire if a prefillable rank's KV usage reaches this"},
    )
    token_usage_low_watermark: float | None = field(
        default=None,
        metadata={
            "help": "atom-coalescer: fire if a prefillable rank's KV usage is below this (off)"
        },
    )

    def __post_init__(self) -> None:
        if not 0 < self.target_fill <= 1:
            raise ValueError(
                f"--atom-coalescer-target-fill must be in (0, 1], got {self.target_fill}"
            )
        for flag, value in (
            ("--atom-coalescer-ttft-max-ticks", self.ttft_max_ticks),
            ("--atom-coalescer-partial-max-ticks", self.partial_max_ticks),
            ("--atom-coalescer-stall-ticks", self.stall_ticks),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag} must be an integer >= 1, got {value!r}")
        if not 0 < self.kv_high_watermark <= 1:
            raise ValueError(
                "--atom-coalescer-kv-high-watermark must be in (0, 1], got "
                f"{self.kv_high_watermark}"
            )
        low = self.token_usage_low_watermark
        if low is not None and not 0 <= low <= 1:
            raise ValueError(
                f"--atom-coalescer-token-usage-low-watermark must be in [0, 1], got {low}"
            )


# Why the group fired (ATOM's per-exit counters), or held.
FIRE_REASONS = ("vacuous", "nodecode", "kv", "ttft", "partial", "fill", "stall")
_FIRE = {reason: GateVote(True, None, reason=reason) for reason in FIRE_REASONS}
# The group fires, but this rank published nothing prefillable: its fresh prompts wait one
# round to be published first.
_UNPUBLISHED = {
    reason: GateVote(False, None, chunks=True, reason=reason) for reason in FIRE_REASONS
}
_ALIGN = GateVote(False, None, reason="align")  # some rank lacks prefill
_HOLD = GateVote(False, None, reason="hold")  # all ready, the forward not yet worth it


class AtomCoalescer(RoundByRound):
    """FIRE or HOLD each round from the group's summed prefill state; the counters move at
    decision time, once per round on every rank, so every rank agrees."""

    extra_columns: tuple[str, ...] = COLUMNS

    def __init__(self, config: AtomCoalescerConfig, rank: int = 0) -> None:
        self.config = config
        self.rank = rank
        self.hold_ticks = 0
        self.stall_count = 0
        self.prev_pending = -1
        self.outcomes: Counter[str] = Counter()  # ATOM's _stat_fire_<reason> and _stat_hold

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        """The group's decision, then whether this rank's prompts were published for it."""
        vote = self.decide(rows)
        self.outcomes[vote.reason or ""] += 1
        if vote.open and not rows[self.rank].extras[_PF]:
            return _UNPUBLISHED[vote.reason or "vacuous"]
        return vote

    def decide(self, rows: Sequence[RankRow]) -> GateVote:
        """ATOM's ``should_allow_prefill`` on last round's rows (the same on every rank)."""
        cfg = self.config
        extras = [row.extras for row in rows]
        pf = [e[_PF] > 0 for e in extras]
        n_prefillable = sum(pf)
        if n_prefillable == 0:
            return self._fire("vacuous")
        if sum(e[_GEN] for e in extras) == 0:
            return self._fire("nodecode")  # no decode to hide the wait behind
        low = cfg.token_usage_low_watermark
        for ready, e in zip(pf, extras, strict=True):
            high = e[_KV] >= cfg.kv_high_watermark * 1000
            starving = low is not None and e[_KV] < low * 1000
            if ready and (high or starving):
                return self._fire("kv")
        if self.hold_ticks >= cfg.ttft_max_ticks:
            return self._fire("ttft")
        partial = any(e[_BACKLOG] > e[_WAIT] for e in extras)
        if partial and self.hold_ticks >= cfg.partial_max_ticks:
            return self._fire("partial")  # a held partial keeps its KV: a tighter bound
        if n_prefillable < len(rows):
            return self._hold(_ALIGN)
        pending = sum(e[_PENDING] for e in extras)
        if pending >= cfg.target_fill * n_prefillable * 1000:
            return self._fire("fill")
        # Give up once the pending total stops growing: more waiting fills nothing.
        self.stall_count = self.stall_count + 1 if pending <= self.prev_pending else 0
        self.prev_pending = pending
        if self.stall_count >= cfg.stall_ticks:
            return self._fire("stall")
        return self._hold(_HOLD)

    def _fire(self, reason: str) -> GateVote:
        self.hold_ticks = 0
        self.stall_count = 0
        self.prev_pending = -1
        return _FIRE[reason]

    def _hold(self, vote: GateVote) -> GateVote:
        self.hold_ticks += 1
        return vote

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        """The counters move at decision time; nothing to learn after the gather."""
        return None


def _build(config: AtomCoalescerConfig, ctx: PolicyContext) -> AtomCoalescer:
    return AtomCoalescer(config, ctx.rank)


POLICY = PolicySpec(
    name="atom-coalescer",
    summary="ROCm ATOM's prefill coalescer: fill target, TTFT cap and stall give-up in ticks",
    config=AtomCoalescerConfig,
    build=_build,
    flag_prefix="atom_coalescer_",
)
