"""The interface ``RankLoop`` calls for prefill permission.

Which policies exist, and their flags, is ``gate.registry``'s business; each policy declares
itself in its own module (``gate.spec.PolicySpec``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gate.rows import RankRow, RoundView
from gate.vote import GateVote


class LocalProbe(Protocol):
    """The rank's fresh probe at vote time (only vLLM's per-rank defer reads it)."""

    @property
    def wants_prefill(self) -> bool: ...

    @property
    def has_decode_work(self) -> bool: ...


class PrefillPolicy(Protocol):
    """Decides each round, from gathered rows only, what prefill this rank may plan.

    ``vote`` reads the rows gathered last round; ``observe`` the rows of the round just
    gathered, with the round's one reading of them (``RoundView``). Both inputs are identical
    on every rank, so group policies agree everywhere. ``extra_columns`` names the int columns
    the policy needs beyond the gate's five; the rank loop asks the scheduler for them and
    appends them to its row of the one gather.
    """

    extra_columns: tuple[str, ...]

    def vote(self, rows: Sequence[RankRow], local: LocalProbe | None = None) -> GateVote: ...

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None: ...
