"""The interface ``RankLoop`` calls for prefill permission (and the simulator, for quiet rounds).

``RoundByRound`` is the quiet-round answer of the policies that have no closed form for them.
Which policies exist, and their flags, is ``roundgate.gate.registry``'s business; each policy
declares itself in its own module (``roundgate.gate.spec.PolicySpec``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from roundgate.gate.rows import RankRow, RoundView
from roundgate.gate.vote import GateVote


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

    A *quiet* round is a busy decode-only one: some rank decodes, none extends, and every
    rank publishes the same row round after round. A group often runs many in a row, and the
    simulator applies them in one step where each policy can say in closed form what they do
    to it (``steady``, ``quiet_rounds_until_open``, ``advance_quiet``); a policy that cannot
    says so, and the simulator runs its rounds one by one.
    """

    extra_columns: tuple[str, ...]
    # Whether the quiet-round answers below are exact: the vote changes no state, reads none
    # of ``extra_columns`` (there are none), and k quiet rounds leave the state that k calls
    # of ``observe`` would.
    steady: bool

    @property
    def rounds_since_prefill(self) -> int | None:
        """Rounds since the group last ran prefill, by the policy's own count (routers and
        metrics read it); None for a policy that keeps no such count."""
        ...

    def vote(self, rows: Sequence[RankRow], local: LocalProbe | None = None) -> GateVote: ...

    def observe(self, rows: Sequence[RankRow], view: RoundView) -> None: ...

    def quiet_rounds_until_open(self, rows: Sequence[RankRow]) -> int | None:
        """In how many quiet rounds from now the vote first lets this rank admit a prompt it
        holds while it wants prefill in ``rows``, every round after this one voting on
        ``rows`` (this round's vote reads the rows gathered last round: the caller asks
        ``vote`` for it). None when the policy cannot tell in closed form (not ``steady``)."""
        ...

    def advance_quiet(self, k: int) -> None:
        """Take the state k observed quiet rounds leave (only a ``steady`` policy can)."""
        ...


class RoundByRound:
    """The quiet-round answers of a policy without a closed form for them (its vote keeps
    state, or it reads extra columns): the simulator runs its rounds one by one. It keeps no
    count of rounds since prefill either."""

    steady = False
    rounds_since_prefill: int | None = None

    def quiet_rounds_until_open(self, rows: Sequence[RankRow]) -> int | None:
        return None

    def advance_quiet(self, k: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no closed form for quiet rounds")
