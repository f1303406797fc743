"""Gate test builders: rank rows from state letters, a gate at a counter, rounds driven."""

from __future__ import annotations

from builders import row

from roundgate.gate.delay import PrefillDelay
from roundgate.gate.group_gate import GroupGate
from roundgate.gate.rows import RankRow, read_rows
from roundgate.gate.vote import GateVote

# One letter per rank: W = backlog and decoding, D = decoding only, P = backlog with nothing to
# decode (an idle row that wants prefill), I = idle.
STATES = {
    "W": {"want": True, "decodes": True},
    "D": {"want": False, "decodes": True},
    "P": {"want": True, "decodes": False},
    "I": {"want": False, "decodes": False},
}


def rows(states: str, extends: str = "") -> list[RankRow]:
    """Rows from a state string (``"WD"``); ``extends`` marks extending ranks with ``x``."""
    extends = extends.ljust(len(states), ".")
    return [row(**STATES[s], extends=int(e == "x")) for s, e in zip(states, extends, strict=True)]


def gate_at(attempt: int, any_: int, rounds_since_prefill: int = 0) -> GroupGate:
    gate = GroupGate(PrefillDelay(attempt, any_))
    gate.rounds_since_prefill = rounds_since_prefill
    return gate


def drive(gate: GroupGate, published: list[str]) -> list[GateVote]:
    """Run one round per entry of ``published`` after the first and return the votes.

    ``published[k]`` is what the ranks publish at the end of round k-1 (``published[0]`` is
    what the gate sees before its first vote). A rank extends in a round iff that round's vote
    opened and the rank published a backlog last round, as ``RankLoop`` plans it.
    """
    last = rows(published[0])
    votes = []
    for states in published[1:]:
        vote = gate.vote(last)
        extends = "".join("x" if vote.open and r.wants_prefill else "." for r in last)
        last = rows(states, extends)
        gate.observe(last, read_rows(last))
        votes.append(vote)
    return votes


def first_open(votes: list[GateVote]) -> tuple[int, GateVote] | None:
    return next(((i, v) for i, v in enumerate(votes) if v.open), None)
