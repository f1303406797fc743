"""The per-rank alternative to the group gate: ``--prefill-decode-interval``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gate.group_gate import CLOSED, GateVote
from gate.rows import RankRow

OPEN_LOCAL = GateVote(True, None)


class LocalIntervalPolicy:
    """After a round in which this rank extended, hold its new prefill for ``interval`` rounds.

    It looks only at its own row, so ranks do not agree on when to prefill: that is the
    behaviour the group gate exists to improve on, and why the two cannot be combined.
    ``interval == 0`` never holds anything.
    """

    extra_columns: tuple[str, ...] = ()

    def __init__(self, interval: int, rank: int = 0) -> None:
        if interval < 0:
            raise ValueError(f"--prefill-decode-interval must be >= 0, got {interval}")
        self.interval = interval
        self.rank = rank
        self.remaining = 0

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        """Open unless the rank is still inside its hold window."""
        return CLOSED if self.remaining > 0 else OPEN_LOCAL

    def observe(self, rows: Sequence[RankRow]) -> None:
        """Start a hold window after an extend on this rank; count down otherwise."""
        if rows[self.rank].num_extends > 0:
            self.remaining = self.interval
        elif self.remaining > 0:
            self.remaining -= 1
