"""SGLang's ``PrefillDelayer`` (``--enable-prefill-delayer``), re-implemented over our rows.

SGLang negotiates with an all-gather of its own at admission time. Here the same inputs ride
the round's single metadata gather as extra columns, so the decision reads the rows gathered
*last* round (what every rank could prefill next, published after its plan), as our gate does.
That shifts the reaction by one round and costs no collective.

Faithful to the fresh negotiation: a rank admits new prompts only if its own row in those
rows said ``prefillable``. A prompt that arrived after the rank published is first published
(the rank says ``prefillable = 1`` this round) and decided on next round, as SGLang decides
on it with every rank's fresh flag. Without this, a lone fresh prompt meets "no rank
prefillable → ALLOW" and goes through at once: the policy would be ``none`` on any workload
with scattered arrivals.

State (``st``, ``skip_first``) is updated only from gathered rows, so every rank agrees on
the group's decision (``reason``); which ranks may then admit is read from their own rows,
which every rank also holds.
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

COLUMNS = ("prefillable", "kv_permille", "running", "max_prefill_bs", "waiting", "now_ms")
_PF, _KV, _RUN, _MP, _WAIT, _NOW = range(len(COLUMNS))


@dataclass(frozen=True)
class SGLangDelayerConfig:
    """SGLang's knobs with its defaults (flags ``--prefill-delayer-*``)."""

    max_delay_passes: int = field(
        default=30, metadata={"help": "sglang-delayer: forward passes a prefill may be delayed"}
    )
    token_usage_low_watermark: float | None = field(
        default=None,
        metadata={
            "help": "sglang-delayer: allow at once if a prefillable rank's KV usage is below "
            "this (0..1)"
        },
    )
    queue_min_ratio: float | None = field(
        default=None,
        metadata={
            "help": "sglang-delayer: also delay while the queue is below running x this ratio"
        },
    )
    max_delay_ms: float = field(
        default=5000.0,
        metadata={"help": "sglang-delayer: the queue condition gives up after this long"},
    )
    prefill_max_requests: int | None = field(
        default=None,
        metadata={
            "help": "sglang-delayer: cap of the queue threshold (unset = the max prefill "
            "batch seen)"
        },
    )

    def __post_init__(self) -> None:
        if self.max_delay_passes < 1:
            raise ValueError(
                f"--prefill-delayer-max-delay-passes must be >= 1, got {self.max_delay_passes}"
            )
        wm = self.token_usage_low_watermark
        if wm is not None and not 0 <= wm <= 1:
            raise ValueError(
                f"--prefill-delayer-token-usage-low-watermark must be in [0, 1], got {wm}"
            )
        if self.queue_min_ratio is not None and not self.queue_min_ratio > 0:
            raise ValueError(
                f"--prefill-delayer-queue-min-ratio must be > 0, got {self.queue_min_ratio}"
            )
        if not self.max_delay_ms > 0:
            raise ValueError(f"--prefill-delayer-max-delay-ms must be > 0, got {self.max_delay_ms}")
        if self.prefill_max_requests is not None and self.prefill_max_requests < 1:
            raise ValueError(
                "--prefill-delayer-prefill-max-requests must be >= 1, got "
                f"{self.prefill_max_requests}"
            )


REASONS = ("none", "token_watermark", "wait_success", "no_wait", "wait_timeout")
_DELAY = GateVote(False, None, chunks=True, reason="delay")
_ALLOW = {reason: GateVote(True, None, reason=reason) for reason in REASONS}
# The group allows, but this rank published nothing prefillable: its fresh prompts wait one
# round to be published first (its resident chunks, if any, still run).
_UNPUBLISHED = {reason: GateVote(False, None, chunks=True, reason=reason) for reason in REASONS}


class SGLangDelayer(RoundByRound):
    """ALLOW or DELAY each round from every rank's prefillable flag, KV usage and queues.

    DELAY holds new requests on every rank but lets a rank in the middle of a chunk run it
    (``GateVote(open=False, chunks=True)``).
    """

    extra_columns: tuple[str, ...] = COLUMNS

    def __init__(
        self, config: SGLangDelayerConfig, max_running_requests: int, rank: int = 0
    ) -> None:
        self.config = config
        self.rank = rank
        self.max_running_requests = max_running_requests  # SGLang's per-rank MRR
        self.state: tuple[int, float] | None = None  # (delayed passes, start ms)
        self.skip_first = True
        # outcomes_total{input_estimation, output_allow, output_reason, actual_execution}
        self.outcomes: Counter[tuple[str, bool, str, bool]] = Counter()
        self.wait_passes: list[int] = []  # histogram samples: passes waited before an ALLOW
        self.wait_ms: list[float] = []
        self._pending: tuple[str, bool, str] | None = None

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        """The group's decision, then whether this rank's prompts were published for it."""
        vote = self.decide(rows)
        if vote.open and not rows[self.rank].extras[_PF]:
            return _UNPUBLISHED[vote.reason or "none"]
        return vote

    def decide(self, rows: Sequence[RankRow]) -> GateVote:
        """``decide(rows, now)`` of PEER_POLICIES.md, on last round's rows (the same on
        every rank)."""
        prev = self.state
        cfg = self.config
        extras = [row.extras for row in rows]
        now = float(max(e[_NOW] for e in extras))
        pf = [e[_PF] > 0 for e in extras]
        if not any(pf):
            return self._allow("none", "none", prev, now)
        estimation = "all" if all(pf) else "mixed"
        wm = cfg.token_usage_low_watermark
        if wm is not None and any(
            p and e[_KV] < wm * 1000 for p, e in zip(pf, extras, strict=True)
        ):
            return self._allow(estimation, "token_watermark", prev, now)
        if estimation == "mixed":
            return self._bounded(estimation, prev, now)
        run = max(e[_RUN] for e in extras)
        mp = max(e[_MP] for e in extras)
        wq = max(e[_WAIT] for e in extras)
        slot = self.max_running_requests - run < mp
        queue = False
        if cfg.queue_min_ratio is not None and run > 0:
            qmin = min(int(run * cfg.queue_min_ratio), cfg.prefill_max_requests or mp)
            waited_out = prev is not None and now - prev[1] >= cfg.max_delay_ms
            queue = qmin > 0 and wq < qmin and not waited_out
        if slot or queue:
            if self.skip_first:
                self.skip_first = False  # SGLang lets the very first such pass through
            else:
                return self._bounded(estimation, prev, now)
        return self._allow(estimation, "wait_success" if prev else "no_wait", prev, now)

    def _bounded(self, estimation: str, prev: tuple[int, float] | None, now: float) -> GateVote:
        count = prev[0] if prev else 0
        if count < self.config.max_delay_passes - 1:
            self.state = (count + 1, prev[1] if prev else now)
            self._pending = (estimation, False, "delay")
            return _DELAY
        return self._allow(estimation, "wait_timeout", prev, now)

    def _allow(
        self, estimation: str, reason: str, prev: tuple[int, float] | None, now: float
    ) -> GateVote:
        self.state = None
        if prev is not None:
            self.wait_passes.append(prev[0])
            self.wait_ms.append(now - prev[1])
        self._pending = (estimation, True, reason)
        return _ALLOW[reason]

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        """Count the outcome with whether prefill actually ran (``actual_execution``)."""
        if self._pending is not None:
            executed = view.any_extend
            self.outcomes[(*self._pending, executed)] += 1
            self._pending = None


def _build(config: SGLangDelayerConfig, ctx: PolicyContext) -> SGLangDelayer:
    return SGLangDelayer(config, ctx.max_batch_size, ctx.rank)


POLICY = PolicySpec(
    name="sglang-delayer",
    summary="SGLang's PrefillDelayer: prefillable, KV usage, running, queues of all ranks",
    config=SGLangDelayerConfig,
    build=_build,
    flag_prefix="prefill_delayer_",
)
