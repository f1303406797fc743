"""Counters a rank keeps about its rounds and gate decisions (exposed by ``stats``)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from roundgate.actors.control.rank_loop import RoundOutcome


@dataclass
class RankStats:
    """Updated once per round on the engine thread; read as a snapshot from others."""

    rounds: int = 0
    busy_rounds: int = 0
    prefill_rounds: int = 0  # any rank of the group extended
    decode_rounds: int = 0  # busy, and nobody extended (also the DeepEP low-latency rounds)
    votes: dict[str, int] = field(default_factory=dict)  # "all:open", "any:closed", …
    local_prefill_rounds: int = 0  # this rank extended
    prefill_tokens: int = 0  # prompt tokens this rank computed (forked sequences add none)
    # (round index, point, open, this rank's extends) of recent rounds: every rank of a
    # group must agree on the first three.
    decisions: deque = field(default_factory=lambda: deque(maxlen=4096))
    last_rows: list[tuple[int, ...]] = field(default_factory=list)

    def observe(self, outcome: RoundOutcome) -> None:
        self.rounds += 1
        vote = outcome.vote
        self.decisions.append((self.rounds, vote.point, vote.open, outcome.plan.num_extends))
        if vote.point is not None:
            key = f"{vote.point}:{'open' if vote.open else 'closed'}"
            self.votes[key] = self.votes.get(key, 0) + 1
        self.last_rows = [row.pack() for row in outcome.rows]
        self.prefill_tokens += outcome.plan.num_prefill_tokens
        view = outcome.view
        if view.all_idle:
            return
        self.busy_rounds += 1
        if view.any_extend:
            self.prefill_rounds += 1
        else:
            self.decode_rounds += 1
        if outcome.plan.num_extends:
            self.local_prefill_rounds += 1

    def snapshot(self) -> dict:
        return {
            "rounds": self.rounds,
            "busy_rounds": self.busy_rounds,
            "prefill_rounds": self.prefill_rounds,
            "decode_rounds": self.decode_rounds,
            "local_prefill_rounds": self.local_prefill_rounds,
            "prefill_tokens": self.prefill_tokens,
            "votes": dict(self.votes),
            "decisions": list(self.decisions),
            "last_rows": list(self.last_rows),
        }
