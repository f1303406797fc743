"""The group prefill gate: ALL/ANY attempt points over the gathered rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roundgate.gate.delay import PrefillDelay
from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.spec import PolicyContext, PolicySpec
from roundgate.gate.vote import CLOSED, GateVote

# Votes are built every round on every rank; the gate's four outcomes are shared constants.
_VOTES = {(o, p): GateVote(o, p) for o in (False, True) for p in ("any", "all")}


class GroupGate:
    """Counts rounds since the last prefill round and opens at ALL or ANY points.

    Every input (the gathered rows and the counter derived from earlier gathered rows) is
    identical on every rank, so every rank reaches the same vote without another collective.
    """

    extra_columns: tuple[str, ...] = ()
    steady = True  # the vote reads the counter and the five columns, and changes nothing

    def __init__(self, delay: PrefillDelay) -> None:
        self.delay = delay
        self.rounds_since_prefill = 0

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        """Decide whether this round may run prefill, from the rows gathered last round."""
        r = self.rounds_since_prefill
        if r != 0 and r % self.delay.any_interval == 0:
            return _VOTES[any(row.wants_prefill for row in rows), "any"]
        if r % self.delay.attempt_interval == 0:
            # A rank with no decode work protects nothing, so it never blocks the ALL point.
            blocked = any(row.has_decode_work and not row.wants_prefill for row in rows)
            return _VOTES[not blocked, "all"]
        return CLOSED

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None:
        """Advance the counter: reset by a prefill round or an idle group, else count on."""
        if view.any_extend or view.all_idle:
            self.rounds_since_prefill = 0
        else:
            self.rounds_since_prefill += 1

    def quiet_rounds_until_open(self, rows: Sequence[RankRow]) -> int:
        """The next ANY point (this rank wants prefill, so it opens), or an earlier ALL point
        if no rank of ``rows`` blocks it: this round observes a quiet round, so round j
        votes with the counter at ``rounds_since_prefill + j``."""
        r = self.rounds_since_prefill
        delay = self.delay
        j = delay.any_interval - r % delay.any_interval
        if not any(row.has_decode_work and not row.wants_prefill for row in rows):
            j = min(j, delay.attempt_interval - r % delay.attempt_interval)
        return j

    def advance_quiet(self, k: int) -> None:
        self.rounds_since_prefill += k  # k busy rounds without an extend


def _build(delay: PrefillDelay, ctx: PolicyContext) -> GroupGate:
    return GroupGate(delay)


POLICY = PolicySpec(
    name="roundgate",
    summary="the group gate: ALL/ANY attempt points over the gate columns",
    config=PrefillDelay,
    build=_build,
)
