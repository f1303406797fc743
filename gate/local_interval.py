"""The per-rank alternative to the group gate: ``--prefill-decode-interval``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.spec import PolicyContext, PolicySpec
from roundgate.gate.vote import CLOSED, OPEN, GateVote


@dataclass(frozen=True)
class LocalIntervalConfig:
    interval: int = field(
        metadata={
            "flag": "prefill_decode_interval",
            "help": "local policy: after a prefill round, hold new prefill for this many rounds",
            "sim_default": 4,
        }
    )

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(
                f"--prefill-decode-interval must be >= 1, got {self.interval} "
                "(leave it unset for no local policy)"
            )


class LocalIntervalPolicy:
    """After a round in which this rank extended, hold its new prefill for ``interval`` rounds.

    It looks only at its own row, so ranks do not agree on when to prefill: that is the
    behaviour the group gate exists to improve on, and why the two cannot be combined.
    ``interval == 0`` never holds anything.
    """

    extra_columns: tuple[str, ...] = ()
    steady = True  # the vote reads only the hold window, and changes nothing
    rounds_since_prefill: int | None = None  # its window is the rank's own, not the group's

    def __init__(self, interval: int, rank: int = 0) -> None:
        if interval < 0:
            raise ValueError(f"--prefill-decode-interval must be >= 0, got {interval}")
        self.interval = interval
        self.rank = rank
        self.remaining = 0

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        """Open unless the rank is still inside its hold window."""
        return CLOSED if self.remaining > 0 else OPEN

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        """Start a hold window after an extend on this rank; count down otherwise."""
        if rows[self.rank].num_extends > 0:
            self.remaining = self.interval
        elif self.remaining > 0:
            self.remaining -= 1

    def quiet_rounds_until_open(self, rows: Sequence[RankRow]) -> int:
        """The end of the hold window: no quiet round extends, so it only counts down."""
        return self.remaining

    def advance_quiet(self, k: int) -> None:
        self.remaining = max(0, self.remaining - k)


def _build(config: LocalIntervalConfig, ctx: PolicyContext) -> LocalIntervalPolicy:
    return LocalIntervalPolicy(config.interval, ctx.rank)


POLICY = PolicySpec(
    name="local-interval",
    summary="the rank's own extends (per-rank hold window)",
    config=LocalIntervalConfig,
    build=_build,
)
