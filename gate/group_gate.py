"""The group prefill gate: ALL/ANY attempt points over the gathered rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gate.delay import PrefillDelay
from gate.permission import ALLOW_ALL, CHUNKS_ONLY, HOLD_ALL, NEW_ONLY, Permission
from gate.rows import RankRow

Point = Literal["any", "all"]


@dataclass(frozen=True, slots=True)
class GateVote:
    """The group's permission for this round. ``point`` is None between attempt points.

    ``open`` admits new prompts. ``chunks`` says whether resident prefill chunks may continue;
    None means "as ``open``" (the gate holds both). ``reason`` is a policy's label for the
    decision (SGLang's ``output_reason``), for metrics only.
    """

    open: bool
    point: Point | None
    chunks: bool | None = None
    reason: str | None = None
    # The two bits the scheduler reads, derived once (votes are read every round).
    permission: Permission = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        chunks = self.open if self.chunks is None else self.chunks
        if self.open:
            permission = ALLOW_ALL if chunks else NEW_ONLY
        else:
            permission = CHUNKS_ONLY if chunks else HOLD_ALL
        object.__setattr__(self, "permission", permission)


CLOSED = GateVote(False, None)
# Votes are built every round on every rank; the gate's four outcomes are shared constants.
_VOTES = {(o, p): GateVote(o, p) for o in (False, True) for p in ("any", "all")}


class GroupGate:
    """Counts rounds since the last prefill round and opens at ALL or ANY points.

    Every input (the gathered rows and the counter derived from earlier gathered rows) is
    identical on every rank, so every rank reaches the same vote without another collective.
    """

    extra_columns: tuple[str, ...] = ()

    def __init__(self, delay: PrefillDelay) -> None:
        self.delay = delay
        self.rounds_since_prefill = 0

    def vote(self, rows: Sequence[RankRow], local: Any = None) -> GateVote:
        """Decide whether this round may run prefill, from the rows gathered last round."""
        r = self.rounds_since_prefill
        if r != 0 and r % self.delay.any_interval == 0:
            opened = False
            for row in rows:
                if row.wants_prefill:
                    opened = True
                    break
            return _VOTES[opened, "any"]
        if r % self.delay.attempt_interval == 0:
            # A rank with no decode work protects nothing, so it never blocks the ALL point.
            opened = True
            for row in rows:
                if row.has_decode_work and not row.wants_prefill:
                    opened = False
                    break
            return _VOTES[opened, "all"]
        return CLOSED

    def observe(self, rows: Sequence[RankRow]) -> None:
        """Advance the counter from this round's gathered rows."""
        idle = True
        for row in rows:
            if row.num_extends > 0:
                self.rounds_since_prefill = 0
                return
            if idle and (row.batch_size or row.num_tokens):
                idle = False
        self.rounds_since_prefill = 0 if idle else self.rounds_since_prefill + 1
