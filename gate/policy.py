"""The interface ``dp_round`` calls for prefill permission, and the policy registry.

| name             | class                 | decides from                                        |
| ---------------- | --------------------- | --------------------------------------------------- |
| `roundgate`      | `GroupGate`           | ALL/ANY attempt points over the gate columns         |
| `none`           | `NoGate`              | nothing: prefill whenever a rank has it              |
| `local-interval` | `LocalIntervalPolicy` | the rank's own extends (per-rank hold window)        |
| `sglang-delayer` | `SGLangDelayer`       | prefillable, KV usage, running, queues of all ranks  |
| `vllm-interval`  | `VllmInterval`        | a shared step clock, plus the rank's own state       |
| `trtllm-balance` | `TrtllmBalance`       | context/generation counts of all ranks               |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gate.delay import PrefillDelay
from gate.group_gate import GateVote, GroupGate
from gate.local_interval import OPEN_LOCAL, LocalIntervalPolicy
from gate.rows import RankRow
from gate.sglang_delayer import SGLangDelayer, SGLangDelayerConfig
from gate.trtllm_balance import TrtllmBalance, TrtllmBalanceConfig
from gate.vllm_interval import VllmInterval

POLICIES = (
    "roundgate",
    "none",
    "local-interval",
    "sglang-delayer",
    "vllm-interval",
    "trtllm-balance",
)


class LocalProbe(Protocol):
    """The rank's fresh probe at vote time (only vLLM's per-rank defer reads it)."""

    @property
    def wants_prefill(self) -> bool: ...

    @property
    def has_decode_work(self) -> bool: ...


class PrefillPolicy(Protocol):
    """Decides each round, from gathered rows only, what prefill this rank may plan.

    ``vote`` reads the rows gathered last round; ``observe`` the rows of the round just
    gathered. Both inputs are identical on every rank, so group policies agree everywhere.
    ``extra_columns`` names the int columns the policy needs beyond the gate's five; the
    rank loop asks the scheduler for them and appends them to its row of the one gather.
    """

    extra_columns: tuple[str, ...]

    def vote(self, rows: Sequence[RankRow], local: LocalProbe | None = None) -> GateVote: ...

    def observe(self, rows: Sequence[RankRow]) -> None: ...


class NoGate:
    """Admit prefill whenever a rank has it: the default a fused engine runs without a gate."""

    extra_columns: tuple[str, ...] = ()

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        return OPEN_LOCAL

    def observe(self, rows: Sequence[RankRow]) -> None:
        return None


def make_policy(
    delay: PrefillDelay | None, prefill_decode_interval: int = 0, rank: int = 0
) -> PrefillPolicy:
    """The group gate when its intervals are set, else the local interval, else no gate."""
    if delay is not None:
        return GroupGate(delay)
    if prefill_decode_interval > 0:
        return LocalIntervalPolicy(prefill_decode_interval, rank)
    return NoGate()


def build_policy(
    name: str,
    rank: int = 0,
    *,
    delay: PrefillDelay | None = None,
    prefill_decode_interval: int = 0,
    sglang: SGLangDelayerConfig | None = None,
    prefill_schedule_interval: int = 1,
    trtllm: TrtllmBalanceConfig | None = None,
) -> PrefillPolicy:
    """One policy by name; each needs its own settings (``ValueError`` naming what is missing)."""
    if name == "roundgate":
        if delay is None:
            raise ValueError(
                "--prefill-policy roundgate needs --prefill-attempt-interval and "
                "--prefill-any-attempt-interval"
            )
        return GroupGate(delay)
    if name == "none":
        return NoGate()
    if name == "local-interval":
        if prefill_decode_interval < 1:
            raise ValueError("--prefill-policy local-interval needs --prefill-decode-interval >= 1")
        return LocalIntervalPolicy(prefill_decode_interval, rank)
    if name == "sglang-delayer":
        if sglang is None:
            raise ValueError("--prefill-policy sglang-delayer needs its SGLangDelayerConfig")
        return SGLangDelayer(sglang)
    if name == "vllm-interval":
        return VllmInterval(prefill_schedule_interval, rank)
    if name == "trtllm-balance":
        if trtllm is None:
            raise ValueError("--prefill-policy trtllm-balance needs its TrtllmBalanceConfig")
        return TrtllmBalance(trtllm)
    raise ValueError(f"--prefill-policy must be one of {', '.join(POLICIES)}, got {name!r}")
