"""The steady policies in closed form: what k decode-only rounds do to their state.

The simulator's fast path (``sim.fast_forward``) skips rounds only under policies
whose vote and update read the gate's five columns and nothing that changes while the group
decodes; for those, the round a held prompt's vote opens and the state after k rounds follow
from each policy's rule without running the k rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.control.rank_loop import RankLoop
from gate import RankRow
from gate.group_gate import GroupGate
from gate.local_interval import LocalIntervalPolicy
from gate.no_gate import NoGate

# Policies whose state after k identical rounds is what k calls of vote/observe give, and
# which read no column that changes while the group decodes.
STEADY_POLICIES = (GroupGate, NoGate, LocalIntervalPolicy)


def supported(loops: Sequence[RankLoop]) -> bool:
    return all(type(loop.policy) in STEADY_POLICIES for loop in loops)


def _next_multiple(r: int, step: int) -> int:
    """Smallest j >= 1 with (r + j) % step == 0."""
    return step - r % step


def held_rounds(loops: Sequence[RankLoop], new_rows: list[RankRow], k: int) -> int:
    """Rounds (up to k) before a vote lets a rank plan a prompt it holds.

    Round 0 votes on the rows gathered last round, the later rounds on ``new_rows``; each
    steady policy's state after round j follows from its rule in closed form.
    """
    first = k
    for i, loop in enumerate(loops):
        s = loop.scheduler
        if not (s.waiting and new_rows[i].wants_prefill and s.can_admit):
            continue
        policy = loop.policy
        if policy.vote(loop.last_rows).permission.allow_new:
            return 0
        if isinstance(policy, GroupGate):
            r = policy.rounds_since_prefill + 1  # round 0 observes a busy decode round
            delay = policy.delay
            j = _next_multiple(r - 1, delay.any_interval)  # an ANY point, someone wants
            blocked = any(row.has_decode_work and not row.wants_prefill for row in new_rows)
            if not blocked:
                j = min(j, _next_multiple(r - 1, delay.attempt_interval))
            first = min(first, j)
        elif isinstance(policy, LocalIntervalPolicy):
            first = min(first, policy.remaining)
        else:  # NoGate: always open
            return 0
    return first


def observe_steady(policy: object, k: int) -> None:
    """The state of a steady policy after observing k busy decode-only rounds."""
    if isinstance(policy, GroupGate):
        policy.rounds_since_prefill += k
    elif isinstance(policy, LocalIntervalPolicy):
        policy.remaining = max(0, policy.remaining - k)
