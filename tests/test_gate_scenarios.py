"""The group prefill gate driven through rounds: opening scenarios, agreement across ranks,
and the latency bound (property)."""

from __future__ import annotations

import pytest
from builders import drive_round, make_args, make_loops, make_request
from gate_rows import drive, first_open, gate_at, rows
from hypothesis import given, settings
from hypothesis import strategies as st

from roundgate.gate.delay import PrefillDelay
from roundgate.gate.group_gate import GroupGate
from roundgate.gate.rows import RankRow, read_rows
from roundgate.gate.vote import GateVote

# --- scenarios: a gate driven through rounds --------------------------------------------------


@pytest.mark.parametrize(("attempt", "any_"), [(1, 1), (1, 4), (2, 6), (3, 3), (4, 10)])
def test_lone_backlog_waits_for_the_any_point(attempt: int, any_: int) -> None:
    # Rank 0 has a prompt waiting every round; rank 1 only decodes.
    votes = drive(GroupGate(PrefillDelay(attempt, any_)), ["WD"] * (any_ + 3))
    assert first_open(votes) == (any_, GateVote(True, "any"))
    # Every round before it was either a blocked ALL point or between points.
    for r, vote in enumerate(votes[:any_]):
        assert vote == GateVote(False, "all" if r % attempt == 0 else None)
    # The open round extended rank 0 and reset the counter: the next vote is an ALL point again.
    assert votes[any_ + 1] == GateVote(False, "all")


def test_lone_backlog_exact_sequence() -> None:
    votes = drive(GroupGate(PrefillDelay(2, 6)), ["WD"] * 9)
    assert [v.point for v in votes] == ["all", None, "all", None, "all", None, "any", "all"]
    assert [v.open for v in votes] == [False] * 6 + [True, False]


@pytest.mark.parametrize(
    ("attempt", "any_", "published", "expected"),
    [
        # A burst on every rank opens at round 0 and drains in consecutive rounds.
        (2, 8, ["WW"] * 4, [(0, "all"), (1, "all"), (2, "all")]),
        # An idle peer does not block ALL.
        (2, 8, ["WI"] * 4, [(0, "all"), (1, "all"), (2, "all")]),
        (4, 8, ["PI"] + ["DI"] * 3, [(0, "all")]),
        # Rank 1's backlog shows up at the end of round 2: the next ALL point (r=4) opens.
        (2, 8, ["WD", "WD", "WD", "WW", "WW", "WW", "WW"], [(4, "all"), (5, "all")]),
        # Rank 1's backlog arrives after the ALL point at r=4 passed: wait for ANY at r=6.
        (4, 6, ["WD"] * 6 + ["WW"] * 2, [(6, "any")]),
        # After the window the backlog is gone on every rank: the gate stays closed.
        (2, 8, ["WW"] + ["DD"] * 12, [(0, "all")]),
    ],
)
def test_opening_rounds(
    attempt: int, any_: int, published: list[str], expected: list[tuple[int, str]]
) -> None:
    votes = drive(GroupGate(PrefillDelay(attempt, any_)), published)
    assert [(i, v.point) for i, v in enumerate(votes) if v.open] == expected


def test_all_idle_round_brings_an_all_point_back() -> None:
    # Counter at 3 (between points); the group goes idle, then a prompt arrives on rank 1.
    gate = gate_at(4, 16, 3)
    gate.observe(rows("II"), read_rows(rows("II")))
    assert gate.rounds_since_prefill == 0
    assert gate.vote(rows("IP")) == GateVote(True, "all")


# Arrivals on a 3-rank group: (round, rank, request id, prompt tokens, max tokens). The ranks'
# backlogs come and go at different times, and "b" is chunked over two rounds.
GROUP_ARRIVALS = [
    (0, 0, "a", 6, 12),
    (2, 1, "b", 20, 6),
    (3, 2, "c", 4, 3),
    (5, 0, "d", 4, 4),
    (8, 2, "e", 10, 8),
    (9, 1, "f", 3, 5),
]


def run_group(policy: str, num_rounds: int = 24) -> list[tuple[list, list[tuple[int, int]]]]:
    """Each round's outcomes and every rank's (waiting, running) after it, in the real loop."""
    loops = make_loops(make_args(3, policy))
    history = []
    for rnd in range(num_rounds):
        for when, rank, rid, prompt_len, max_tokens in GROUP_ARRIVALS:
            if when == rnd:
                loops[rank].scheduler.add_request(make_request(rid, prompt_len, max_tokens))
        outcomes = drive_round(loops)
        local = [
            (len(loop.scheduler.queues.waiting), len(loop.scheduler.queues.running))
            for loop in loops
        ]
        history.append((outcomes, local))
        if policy == "roundgate":
            # Every rank's gate holds the same counter after every round.
            assert len({loop.policy.rounds_since_prefill for loop in loops}) == 1
    assert not any(loop.scheduler.has_unfinished for loop in loops)
    return history


def test_ranks_gates_agree_round_by_round_while_their_local_states_differ() -> None:
    """Each rank's gate only ever sees the gathered rows, so the ranks vote alike every round
    even though their queues, batches and plans differ: the group opens and closes together."""
    history = run_group("roundgate")
    for outcomes, _ in history:
        assert len({o.vote for o in outcomes}) == 1
        if not outcomes[0].vote.open:
            assert all(o.plan.num_extends == 0 for o in outcomes)
    # The ranks' own states differ in most busy rounds, and agreeing on the vote is not
    # agreeing on the plan: in some open rounds one rank extends while another does not.
    busy = [local for outcomes, local in history if outcomes[0].view.busy]
    assert sum(len(set(local)) > 1 for local in busy) > len(busy) // 2
    assert any(len({o.plan.num_extends > 0 for o in outcomes}) > 1 for outcomes, _ in history)
    votes = [outcomes[0].vote for outcomes, _ in history]
    assert {(v.point, v.open) for v in votes} >= {
        ("all", True),
        ("all", False),
        ("any", True),
        (None, False),
    }


def test_a_per_rank_policy_on_the_same_rounds_does_not_agree() -> None:
    """The contrast: the local interval reads the rank's own extends, so on the same workload
    the ranks' votes split, and one rank prefills while another holds its prompt."""
    history = run_group("local-interval")
    assert any(len({o.vote for o in outcomes}) > 1 for outcomes, _ in history)


# --- the latency bound (property) -------------------------------------------------------------


@st.composite
def delays(draw: st.DrawFn) -> PrefillDelay:
    attempt = draw(st.integers(1, 6))
    return PrefillDelay(attempt, draw(st.integers(attempt, 12)))


# Raw material of one rank's row: (decodes, want, extends, extra batch, extra tokens).
raw_rows = st.tuples(
    st.booleans(),
    st.booleans(),
    st.integers(0, 3),
    st.integers(0, 8),
    st.integers(0, 4096),
)


def consistent_row(
    raw: tuple[bool, bool, int, int, int], *, want: bool, can_extend: bool, must_extend: bool
) -> RankRow:
    """Shape a random row so it could come out of ``dp_round``.

    A rank extends only when the vote opened and it had a backlog. A rank that publishes decode
    work, or extends, planned a batch this round: decodes are never held, so a rank with decode
    work is never idle. (Without that invariant an all-idle reset could pin the counter at an
    ALL point that a decoding rank keeps blocking.)
    """
    decodes, raw_want, raw_extends, extra_batch, extra_tokens = raw
    num_extends = raw_extends if can_extend else 0
    if must_extend:
        num_extends = max(1, num_extends)
    batch = num_extends + int(decodes) + extra_batch
    tokens = 0 if batch == 0 else batch + extra_tokens
    return RankRow(tokens, batch, num_extends, want or raw_want, decodes)


MAX_RANKS = 4


@settings(max_examples=150, deadline=None)
@given(
    delay=delays(),
    num_ranks=st.integers(1, MAX_RANKS),
    backlog_rank=st.integers(0, MAX_RANKS - 1),
    rounds=st.lists(
        st.lists(raw_rows, min_size=MAX_RANKS, max_size=MAX_RANKS), min_size=2, max_size=60
    ),
)
def test_backlog_never_waits_more_than_any_interval(
    delay: PrefillDelay,
    num_ranks: int,
    backlog_rank: int,
    rounds: list[list[tuple[bool, bool, int, int, int]]],
) -> None:
    backlog_rank %= num_ranks
    gate = GroupGate(delay)
    last = [
        consistent_row(raw, want=rank == backlog_rank, can_extend=False, must_extend=False)
        for rank, raw in enumerate(rounds[0][:num_ranks])
    ]
    closed_streak = 0
    for raws in rounds[1:]:
        vote = gate.vote(last)
        closed_streak = 0 if vote.open else closed_streak + 1
        assert closed_streak <= delay.any_interval
        # The backlog rank always extends in an open round; other backlogged ranks may.
        last = [
            consistent_row(
                raw,
                want=rank == backlog_rank,
                can_extend=vote.open and prev.wants_prefill,
                must_extend=vote.open and rank == backlog_rank,
            )
            for rank, (raw, prev) in enumerate(zip(raws, last, strict=False))
        ]
        gate.observe(last, read_rows(last))
        assert gate.rounds_since_prefill <= delay.any_interval
