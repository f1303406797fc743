"""The per-rank ``--prefill-decode-interval`` policy: a hold window after the rank's own prefill."""

from __future__ import annotations

import re

import pytest
from builders import row

from roundgate.gate import registry
from roundgate.gate.local_interval import LocalIntervalConfig, LocalIntervalPolicy
from roundgate.gate.rows import RankRow, read_rows
from roundgate.gate.spec import PolicyContext
from roundgate.gate.vote import GateVote

# A decoding rank with a prompt waiting, and the same rank extending a prompt chunk.
WAITING = row(want=True)
EXTENDING = row(want=True, extends=1)


def group(num_ranks: int, extending: set[int]) -> list[RankRow]:
    return [EXTENDING if rank in extending else WAITING for rank in range(num_ranks)]


def observe(policy: LocalIntervalPolicy, rows: list[RankRow]) -> None:
    policy.observe(rows, read_rows(rows))


def drive(policy: LocalIntervalPolicy, num_rounds: int, num_ranks: int = 1) -> list[bool]:
    """Votes of a rank that always has a prompt waiting and extends whenever it may."""
    last = group(num_ranks, set())
    opens = []
    for _ in range(num_rounds):
        vote = policy.vote(last)
        opens.append(vote.open)
        last = group(num_ranks, {policy.rank} if vote.open else set())
        observe(policy, last)
    return opens


def drive_step(policy: LocalIntervalPolicy) -> bool:
    """One round on a rank with nothing to extend."""
    is_open = policy.vote([WAITING]).open
    observe(policy, [WAITING])
    return is_open


@pytest.mark.parametrize(
    ("interval", "expected"),
    [
        (0, "oooooooo"),
        (1, "o.o.o.o."),
        (2, "o..o..o."),
        (3, "o...o..."),
        (5, "o.....o."),
    ],
)
def test_hold_window_is_exactly_interval_rounds(interval: int, expected: str) -> None:
    opens = drive(LocalIntervalPolicy(interval), len(expected))
    assert "".join("o" if is_open else "." for is_open in opens) == expected


@pytest.mark.parametrize("interval", [1, 2, 4, 7])
def test_hold_counts_from_the_extend(interval: int) -> None:
    policy = LocalIntervalPolicy(interval)
    observe(policy, [EXTENDING])
    held = 0
    while not policy.vote([WAITING]).open:
        held += 1
        observe(policy, [WAITING])
    assert held == interval


def test_interval_zero_never_holds() -> None:
    policy = LocalIntervalPolicy(0)
    for _ in range(10):
        assert policy.vote([EXTENDING]).open
        observe(policy, [EXTENDING])


def test_votes_carry_no_attempt_point() -> None:
    policy = LocalIntervalPolicy(1)
    assert policy.vote([WAITING]) == GateVote(True, None)
    observe(policy, [EXTENDING])
    assert policy.vote([WAITING]) == GateVote(False, None)


@pytest.mark.parametrize(("rank", "num_ranks"), [(0, 2), (1, 2), (2, 4)])
def test_other_ranks_extends_do_not_start_a_hold(rank: int, num_ranks: int) -> None:
    policy = LocalIntervalPolicy(3, rank=rank)
    others = set(range(num_ranks)) - {rank}
    for _ in range(6):
        rows = group(num_ranks, others)
        assert policy.vote(rows).open
        observe(policy, rows)


def test_other_ranks_extends_do_not_restart_a_hold() -> None:
    policy = LocalIntervalPolicy(2, rank=1)
    observe(policy, group(3, {1}))
    opens = []
    for _ in range(4):
        rows = group(3, {0, 2})
        opens.append(policy.vote(rows).open)
        observe(policy, rows)
    assert opens == [False, False, True, True]


def test_own_extend_inside_the_window_restarts_it() -> None:
    # e.g. a resident chunk the scheduler still extends: the hold counts from the last prefill.
    policy = LocalIntervalPolicy(3)
    observe(policy, [EXTENDING])
    observe(policy, [WAITING])
    observe(policy, [EXTENDING])
    assert [drive_step(policy) for _ in range(4)] == [False, False, False, True]


@pytest.mark.parametrize("interval", [-1, -5])
def test_negative_interval_names_the_flag(interval: int) -> None:
    with pytest.raises(ValueError, match="--prefill-decode-interval"):
        LocalIntervalPolicy(interval)


@pytest.mark.parametrize("interval", [0, -3])
def test_the_flag_refuses_zero_and_says_to_leave_it_unset(interval: int) -> None:
    with pytest.raises(ValueError, match=re.escape("--prefill-decode-interval must be >= 1")):
        LocalIntervalConfig(interval)
    with pytest.raises(ValueError, match="leave it unset"):
        registry.build(
            "local-interval", {"prefill_decode_interval": interval}, PolicyContext(0, 2, 4)
        )


def test_the_flag_builds_the_policy_for_its_rank() -> None:
    policy = registry.build(
        "local-interval", {"prefill_decode_interval": 3}, PolicyContext(1, 2, 4)
    )
    assert isinstance(policy, LocalIntervalPolicy)
    assert (policy.interval, policy.rank, policy.remaining) == (3, 1, 0)
    # It reads its own rank's row: rank 0's extend starts nothing, its own starts the window.
    observe(policy, group(2, {0}))
    assert policy.vote(group(2, set())).open
    observe(policy, group(2, {1}))
    assert policy.vote(group(2, set())) == GateVote(False, None)
