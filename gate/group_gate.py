"""The group prefill gate: ALL/ANY attempt points over the gathered rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gate.delay import PrefillDelay
from gate.rows import RankRow

Point = Literal["any", "all"]


@dataclass(frozen=True, slots=True)
class GateVote:
    """The group's permission for this round. ``point`` is None between attempt points."""

    open: bool
    point: Point | None


CLOSED = GateVote(False, None)


class GroupGate:
    """Counts rounds since the last prefill round and opens at ALL or ANY points.

    Every input (the gathered rows and the counter derived from earlier gathered rows) is
    identical on every rank, so every rank reaches the same vote without another collective.
    """

    def __init__(self, delay: PrefillDelay) -> None:
        self.delay = delay
        self.rounds_since_prefill = 0

    def vote(self, rows: Sequence[RankRow]) -> GateVote:
        """Decide whether this round may run prefill, from the rows gathered last round."""
        r = self.rounds_since_prefill
        if r != 0 and r % self.delay.any_interval == 0:
            return GateVote(any(row.wants_prefill for row in rows), "any")
        if r % self.delay.attempt_interval == 0:
            # A rank with no decode work protects nothing, so it never blocks the ALL point.
            return GateVote(
                all(row.wants_prefill or not row.has_decode_work for row in rows), "all"
            )
        return CLOSED

    def observe(self, rows: Sequence[RankRow]) -> None:
        """Advance the counter from this round's gathered rows."""
        if any(row.num_extends > 0 for row in rows) or all(row.is_idle for row in rows):
            self.rounds_since_prefill = 0
        else:
            self.rounds_since_prefill += 1
