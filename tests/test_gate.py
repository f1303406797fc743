"""The group prefill gate: PrefillDelay, RankRow, RoundView and every GroupGate rule of
DESIGN.md."""

from __future__ import annotations

import dataclasses
import re

import pytest
from builders import drive_round, make_args, make_loops, make_request, row
from hypothesis import given, settings
from hypothesis import strategies as st

from gate import COLUMNS, GateVote, GroupGate, PrefillDelay, RankRow, RoundView, read_rows, registry
from gate.spec import PolicyContext

# --- builders ---------------------------------------------------------------------------------

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


# --- PrefillDelay -----------------------------------------------------------------------------


@pytest.mark.parametrize(("attempt", "any_"), [(1, 1), (1, 8), (4, 4), (4, 16)])
def test_prefill_delay_accepts(attempt: int, any_: int) -> None:
    delay = PrefillDelay(attempt, any_)
    assert (delay.attempt_interval, delay.any_interval) == (attempt, any_)


@pytest.mark.parametrize(
    ("attempt", "any_", "flag"),
    [
        (0, 4, "--prefill-attempt-interval"),
        (-2, 4, "--prefill-attempt-interval"),
        (4, 0, "--prefill-any-attempt-interval"),
        (1, -1, "--prefill-any-attempt-interval"),
        (4, 2, "--prefill-any-attempt-interval"),  # any < attempt
        (8, 7, "--prefill-any-attempt-interval"),
        (2.0, 4, "--prefill-attempt-interval"),  # non-int
        ("4", 8, "--prefill-attempt-interval"),
        (True, 4, "--prefill-attempt-interval"),  # bool is not an interval
        (4, None, "--prefill-any-attempt-interval"),
        (4, 8.5, "--prefill-any-attempt-interval"),
    ],
)
def test_prefill_delay_refusal_names_the_flag(attempt: object, any_: object, flag: str) -> None:
    with pytest.raises(ValueError, match=re.escape(flag)):
        PrefillDelay(attempt, any_)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"prefill_attempt_interval": 4}, "roundgate needs --prefill-any-attempt-interval"),
        ({"prefill_any_attempt_interval": 4}, "roundgate needs --prefill-attempt-interval"),
        (
            {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 2},
            "--prefill-any-attempt-interval (2) must be >= --prefill-attempt-interval (4)",
        ),
        (
            {"prefill_attempt_interval": "4", "prefill_any_attempt_interval": 8},
            "--prefill-attempt-interval must be an integer",
        ),
        (
            {"prefill_attempt_interval": 0, "prefill_any_attempt_interval": 8},
            "--prefill-attempt-interval must be >= 1",
        ),
    ],
)
def test_roundgate_flags_are_refused_naming_the_flag(given: dict, message: str) -> None:
    """The flags a config gives (by name) reach ``PrefillDelay``'s validation unchanged."""
    with pytest.raises(ValueError, match=re.escape(message)):
        registry.build("roundgate", given, PolicyContext(rank=0, dp_size=2, max_batch_size=4))


def test_roundgate_flags_build_the_gate_with_those_intervals() -> None:
    given = {"prefill_attempt_interval": 3, "prefill_any_attempt_interval": 9}
    gate = registry.build("roundgate", given, PolicyContext(rank=1, dp_size=2, max_batch_size=4))
    assert isinstance(gate, GroupGate)
    assert gate.delay == PrefillDelay(3, 9) and gate.rounds_since_prefill == 0


# --- RankRow ----------------------------------------------------------------------------------


def test_columns_are_the_row_fields_in_order() -> None:
    assert tuple(f.name for f in dataclasses.fields(RankRow)) == COLUMNS


@given(
    num_tokens=st.integers(0, 2**62),
    batch_size=st.integers(0, 2**31),
    num_extends=st.integers(0, 2**31),
    wants_prefill=st.booleans(),
    has_decode_work=st.booleans(),
    extras=st.lists(st.integers(-(2**62), 2**62), max_size=6).map(tuple),
)
def test_pack_unpack_round_trip(
    num_tokens: int,
    batch_size: int,
    num_extends: int,
    wants_prefill: bool,
    has_decode_work: bool,
    extras: tuple[int, ...],
) -> None:
    original = RankRow(num_tokens, batch_size, num_extends, wants_prefill, has_decode_work, extras)
    packed = original.pack()
    assert all(type(v) is int for v in packed)
    # Each packed value sits in the column COLUMNS names for it; the policy's columns follow.
    assert dict(zip(COLUMNS, packed[: len(COLUMNS)], strict=True)) == {
        name: int(getattr(original, name)) for name in COLUMNS
    }
    assert packed[len(COLUMNS) :] == extras
    for unpacked in (RankRow.unpack(packed), RankRow.unpack(list(packed))):
        assert unpacked == original
        # Equality ignores extras, so check them (and the whole packed row) on their own.
        assert unpacked.extras == extras
        assert unpacked.pack() == packed


def test_unpack_keeps_trailing_columns_as_extras() -> None:
    got = RankRow.unpack((7, 3, 1, 1, 0, 99, -5))
    assert (got.num_tokens, got.batch_size, got.num_extends) == (7, 3, 1)
    assert got.wants_prefill is True and got.has_decode_work is False
    assert got.extras == (99, -5)
    assert got.pack() == (7, 3, 1, 1, 0, 99, -5)
    # The extras are not part of the row's identity (equality covers the gate's five columns).
    assert got == RankRow(7, 3, 1, True, False) and RankRow(7, 3, 1, True, False).extras == ()


@pytest.mark.parametrize("num_columns", [0, 1, len(COLUMNS) - 1])
def test_unpack_too_few_columns_raises(num_columns: int) -> None:
    with pytest.raises(ValueError, match=f"needs {len(COLUMNS)} columns"):
        RankRow.unpack((1,) * num_columns)


@pytest.mark.parametrize(
    ("candidate", "is_idle"),
    [
        (row(decodes=False, want=False), True),
        (row(decodes=False, want=True), True),  # a waiting prompt plans nothing yet
        (row(decodes=True), False),
        (row(decodes=False, extends=1), False),
        (row(decodes=False, batch=0, tokens=3), False),
        (row(decodes=False, batch=1, tokens=0), False),
    ],
)
def test_is_idle(candidate: RankRow, is_idle: bool) -> None:
    assert candidate.is_idle is is_idle


# --- RoundView: the one reading of a round's rows ---------------------------------------------


@pytest.mark.parametrize(
    ("group", "any_extend", "all_idle", "low_latency", "decode_only"),
    [
        pytest.param("II", False, True, True, False, id="all-idle"),
        pytest.param("PI", False, True, True, False, id="all-idle-with-a-waiting-prompt"),
        pytest.param("DII", False, False, True, True, id="one-decoding"),
        pytest.param("DxD", True, False, False, False, id="one-extending-among-decoders"),
        pytest.param("Ix", True, False, False, False, id="idle-and-extending"),
    ],
)
def test_read_rows(
    group: str, any_extend: bool, all_idle: bool, low_latency: bool, decode_only: bool
) -> None:
    """One letter per rank: I idle, P idle with a prompt waiting, D decoding, x extending a
    prompt with nothing to decode."""
    kinds = {
        "I": row(decodes=False),
        "P": row(want=True, decodes=False),
        "D": row(),
        "x": row(decodes=False, extends=1),
    }
    gathered = [kinds[k] for k in group]
    view = read_rows(gathered)
    assert (view.any_extend, view.all_idle) == (any_extend, all_idle)
    assert (view.low_latency, view.decode_only) == (low_latency, decode_only)
    assert view.busy is not all_idle
    assert view == RoundView(any_extend, all_idle)
    # The reading is of the group, not of any rank's position in it.
    assert read_rows(gathered[::-1]) == view


@st.composite
def planned_rows(draw: st.DrawFn) -> RankRow:
    """A row a plan can produce: every extend and decode is a chunk of at least one token."""
    extends, decodes = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    batch = extends + decodes
    tokens = batch + draw(st.integers(0, 3)) * extends
    return RankRow(tokens, batch, extends, draw(st.booleans()), decodes > 0)


@given(st.lists(planned_rows(), min_size=1, max_size=6))
def test_read_rows_is_any_extend_and_all_idle(gathered: list[RankRow]) -> None:
    view = read_rows(gathered)
    assert view.any_extend is any(r.num_extends > 0 for r in gathered)
    assert view.all_idle is all(r.is_idle for r in gathered)


# --- vote: one round at a given counter -------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "any_", "r", "states", "expected"),
    [
        # Round 0 is an ALL point.
        (2, 4, 0, "WW", GateVote(True, "all")),
        (2, 4, 0, "WD", GateVote(False, "all")),  # a decoding peer without backlog blocks ALL
        (2, 4, 0, "DD", GateVote(False, "all")),
        # A rank with no decode work never blocks ALL.
        (2, 4, 0, "WI", GateVote(True, "all")),
        (2, 4, 0, "PI", GateVote(True, "all")),
        (2, 4, 0, "WWI", GateVote(True, "all")),
        (2, 4, 0, "II", GateVote(True, "all")),  # open with nothing to plan is harmless
        # Later ALL points: r % attempt == 0 and not an ANY point.
        (2, 4, 2, "WW", GateVote(True, "all")),
        (2, 4, 6, "WD", GateVote(False, "all")),
        (3, 9, 3, "WP", GateVote(True, "all")),
        # ANY points: r != 0 and r % any == 0; one rank's backlog is enough.
        (2, 4, 4, "WD", GateVote(True, "any")),
        (2, 4, 8, "DDW", GateVote(True, "any")),
        (2, 4, 4, "DD", GateVote(False, "any")),
        (2, 4, 4, "II", GateVote(False, "any")),  # ANY needs a backlog, idle or not
        (3, 5, 5, "DP", GateVote(True, "any")),
        # ANY wins on coinciding points: r=4 is both an ALL (attempt 2) and an ANY (any 4) point.
        (2, 4, 4, "WW", GateVote(True, "any")),
        (2, 4, 12, "DI", GateVote(False, "any")),  # ALL would have opened; ANY decides
        (1, 1, 1, "DI", GateVote(False, "any")),
        (1, 1, 1, "WD", GateVote(True, "any")),
        (3, 3, 3, "WD", GateVote(True, "any")),
        # attempt 1: every round that is not an ANY point is an ALL point.
        (1, 3, 1, "WD", GateVote(False, "all")),
        (1, 3, 2, "WW", GateVote(True, "all")),
        # Single-rank gate: the same rules on the rank's own row.
        (2, 4, 0, "W", GateVote(True, "all")),
        (2, 4, 0, "D", GateVote(False, "all")),
        (2, 4, 1, "W", GateVote(False, None)),
        (2, 4, 2, "W", GateVote(True, "all")),
        (2, 4, 4, "W", GateVote(True, "any")),
    ],
)
def test_vote(attempt: int, any_: int, r: int, states: str, expected: GateVote) -> None:
    gate = gate_at(attempt, any_, r)
    assert gate.vote(rows(states)) == expected
    assert gate.rounds_since_prefill == r  # voting never moves the counter


@pytest.mark.parametrize(
    ("attempt", "any_", "r"),
    [(2, 4, 1), (2, 4, 3), (2, 4, 5), (3, 9, 1), (3, 9, 2), (3, 9, 4), (3, 9, 8), (3, 9, 10)],
)
@pytest.mark.parametrize("states", ["WW", "WD", "PI", "W"])
def test_between_points_closed_with_point_none(
    attempt: int, any_: int, r: int, states: str
) -> None:
    assert gate_at(attempt, any_, r).vote(rows(states)) == GateVote(False, None)


def test_fresh_gate_starts_at_an_all_point() -> None:
    gate = GroupGate(PrefillDelay(4, 16))
    assert gate.rounds_since_prefill == 0
    assert gate.vote(rows("WW")) == GateVote(True, "all")


# --- observe: the counter ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("r", "states", "extends", "expected_r"),
    [
        (0, "DD", "", 1),
        (5, "WD", "", 6),
        (3, "DI", "", 4),  # one decoding rank keeps the group busy
        (3, "PD", "", 4),
        # Any extend resets the counter.
        (5, "WD", "x.", 0),
        (7, "DDW", "..x", 0),
        (2, "D", "x", 0),
        # An all-idle round resets it too, so a prompt reaching an idle engine meets an ALL point.
        (6, "II", "", 0),
        (6, "PI", "", 0),  # a waiting prompt has planned nothing yet
        (6, "I", "", 0),
    ],
)
def test_observe(r: int, states: str, extends: str, expected_r: int) -> None:
    gate = gate_at(2, 8, r)
    observed = rows(states, extends)
    gate.observe(observed, read_rows(observed))
    assert gate.rounds_since_prefill == expected_r


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
        local = [(len(loop.scheduler.waiting), len(loop.scheduler.running)) for loop in loops]
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
