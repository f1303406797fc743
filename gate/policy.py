"""The interface ``dp_round`` calls for prefill permission, and the built-in policies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gate.delay import PrefillDelay
from gate.group_gate import GateVote, GroupGate
from gate.local_interval import OPEN_LOCAL, LocalIntervalPolicy
from gate.rows import RankRow


class PrefillPolicy(Protocol):
    """Decides each round, from gathered rows only, whether prefill may be planned.

    ``vote`` reads the rows gathered last round; ``observe`` the rows of the round just
    gathered. Both inputs are identical on every rank, so group policies agree everywhere.
    """

    def vote(self, rows: Sequence[RankRow]) -> GateVote: ...

    def observe(self, rows: Sequence[RankRow]) -> None: ...


class NoGate:
    """Admit prefill whenever a rank has it: the default a fused engine runs without a gate."""

    def vote(self, rows: Sequence[RankRow]) -> GateVote:
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
