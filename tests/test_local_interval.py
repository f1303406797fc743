"""The per-rank ``--prefill-decode-interval`` policy: a hold window after the rank's own prefill."""

from __future__ import annotations

import pytest

from gate import GateVote, LocalIntervalPolicy, RankRow


def row(extends: int = 0) -> RankRow:
    """A decoding rank with a prompt waiting; ``extends`` prefill chunks planned this round."""
    return RankRow(
        num_tokens=4 + 100 * extends,
        batch_size=4 + extends,
        num_extends=extends,
        wants_prefill=True,
        has_decode_work=True,
    )


def group(num_ranks: int, extending: set[int]) -> list[RankRow]:
    return [row(extends=int(rank in extending)) for rank in range(num_ranks)]


def drive(policy: LocalIntervalPolicy, num_rounds: int, num_ranks: int = 1) -> list[bool]:
    """Votes of a rank that always has a prompt waiting and extends whenever it may."""
    last = group(num_ranks, set())
    opens = []
    for _ in range(num_rounds):
        vote = policy.vote(last)
        opens.append(vote.open)
        last = group(num_ranks, {policy.rank} if vote.open else set())
        policy.observe(last)
    return opens


def drive_step(policy: LocalIntervalPolicy) -> bool:
    """One round on a rank with nothing to extend."""
    is_open = policy.vote([row()]).open
    policy.observe([row()])
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
    policy.observe([row(extends=1)])
    held = 0
    while not policy.vote([row()]).open:
        held += 1
        policy.observe([row()])
    assert held == interval


def test_interval_zero_never_holds() -> None:
    policy = LocalIntervalPolicy(0)
    for _ in range(10):
        assert policy.vote([row(extends=1)]).open
        policy.observe([row(extends=1)])


def test_votes_carry_no_attempt_point() -> None:
    policy = LocalIntervalPolicy(1)
    assert policy.vote([row()]) == GateVote(True, None)
    policy.observe([row(extends=1)])
    assert policy.vote([row()]) == GateVote(False, None)


@pytest.mark.parametrize(("rank", "num_ranks"), [(0, 2), (1, 2), (2, 4)])
def test_other_ranks_extends_do_not_start_a_hold(rank: int, num_ranks: int) -> None:
    policy = LocalIntervalPolicy(3, rank=rank)
    others = set(range(num_ranks)) - {rank}
    for _ in range(6):
        rows = group(num_ranks, others)
        assert policy.vote(rows).open
        policy.observe(rows)


def test_other_ranks_extends_do_not_restart_a_hold() -> None:
    policy = LocalIntervalPolicy(2, rank=1)
    policy.observe(group(3, {1}))
    opens = []
    for _ in range(4):
        rows = group(3, {0, 2})
        opens.append(policy.vote(rows).open)
        policy.observe(rows)
    assert opens == [False, False, True, True]


def test_own_extend_inside_the_window_restarts_it() -> None:
    # e.g. a resident chunk the scheduler still extends: the hold counts from the last prefill.
    policy = LocalIntervalPolicy(3)
    policy.observe([row(extends=1)])
    policy.observe([row()])
    policy.observe([row(extends=1)])
    assert [drive_step(policy) for _ in range(4)] == [False, False, False, True]


@pytest.mark.parametrize("interval", [-1, -5])
def test_negative_interval_names_the_flag(interval: int) -> None:
    with pytest.raises(ValueError, match="--prefill-decode-interval"):
        LocalIntervalPolicy(interval)
