"""The group prefill gate's parts: PrefillDelay, RankRow, RoundView, and its vote and counter
rules of DESIGN.md, one round at a time."""

from __future__ import annotations

import dataclasses
import re

import pytest
from builders import row
from gate_rows import gate_at, rows
from hypothesis import given
from hypothesis import strategies as st

from roundgate.gate import registry
from roundgate.gate.delay import PrefillDelay
from roundgate.gate.group_gate import GroupGate
from roundgate.gate.rows import COLUMNS, RankRow, RoundView, read_rows
from roundgate.gate.spec import PolicyContext
from roundgate.gate.vote import GateVote

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
def test_a_lone_row_reads_idle_only_with_nothing_planned(candidate: RankRow, is_idle: bool) -> None:
    assert read_rows([candidate]).all_idle is is_idle


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
    assert view.all_idle is all(r.batch_size == 0 and r.num_tokens == 0 for r in gathered)


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
