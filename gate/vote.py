"""A policy's decision for one round, and the two bits the scheduler reads from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from roundgate.gate.permission import ALLOW_ALL, CHUNKS_ONLY, HOLD_ALL, NEW_ONLY, Permission

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


# Open with no attempt point: the vote of a policy that lets this rank prefill now.
OPEN = GateVote(True, None)
