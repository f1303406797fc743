"""``roundgate-auto``: pacing, ALL, waits priced against each prompt's prefill and the SLO,
liveness; and the online fit of what a prefill costs. Pure functions of rows."""

from __future__ import annotations

import itertools

import pytest
from sim_builders import make_spec, simulate

from roundgate.cli.engine_flags import parse_server_args
from roundgate.gate.auto import AutoGate, AutoGateConfig
from roundgate.gate.prefill_cost import PrefillCost, prefill_tokens
from roundgate.gate.rows import COLUMNS as ROW_COLUMNS
from roundgate.gate.rows import RankRow, read_rows
from roundgate.sim.round_costs import PRESETS

DECODE_MS = 30


def auto_row(
    want: bool,
    decodes: int = 4,
    extend_tokens: int = 0,
    head_tokens: int = 200,
    head: int = 0,
    now: int = 0,
    backlog: int | None = None,
    accepted: int = 0,
) -> RankRow:
    """A rank's row with the auto gate's columns (head tokens, head wait rounds, now ms,
    backlog tokens); ``extend_tokens`` > 0 makes it extend one prompt of that many tokens."""
    extends = int(extend_tokens > 0)
    extras = (
        head_tokens if want else 0,
        head if want else 0,
        now,
        (head_tokens if backlog is None else backlog) if want else 0,
        accepted,
    )
    return RankRow(decodes + extend_tokens, decodes + extends, extends, want, decodes > 0, extras)


def step(gate: AutoGate, rows: list[RankRow]):
    vote = gate.vote(rows)
    gate.observe(rows, read_rows(rows))
    return vote


def learned(per_token: float = 0.15, fixed: float = 20.0, **config) -> tuple[AutoGate, int]:
    """A gate that has seen decode rounds of 30 ms and extends costing ``fixed + per_token *
    tokens`` more (1,000 and 3,000 tokens); returns it and the clock after."""
    gate = AutoGate(AutoGateConfig(**config))
    t = 0
    for tokens in (0, 0, 1000, 0, 0, 0, 3000, 0, 0, 0, 1000, 0, 0, 0):
        row = auto_row(False, extend_tokens=tokens, now=t)
        step(gate, [row, auto_row(False, now=t)])
        t += DECODE_MS + (round(fixed + per_token * tokens) if tokens else 0)
    return gate, t


def test_prefill_cost_fits_the_fixed_and_per_token_step() -> None:
    cost = PrefillCost()
    cost.add_round(30.0, 0)
    for tokens in (1000, 3000, 2000, 500):
        cost.add_round(30.0 + 20.0 + 0.15 * tokens, tokens)
    assert cost.decode_ms == 30.0
    assert cost.step_ms(0) == pytest.approx(20.0, abs=1e-6)
    assert cost.step_ms(40_000) == pytest.approx(20.0 + 0.15 * 40_000, rel=1e-6)


def test_prefill_cost_needs_a_decode_round_before_an_extend() -> None:
    cost = PrefillCost()
    cost.add_round(500.0, 1000)  # nothing to subtract it from yet: not a sample
    assert not cost.known and cost.step_ms(1000) == 0.0
    cost.add_round(30.0, 0)
    cost.add_round(180.0, 1000)  # one length so far: all of the step is per token
    assert cost.step_ms(2000) == pytest.approx(300.0)


def test_prefill_tokens_is_the_longest_extend_of_the_round() -> None:
    rows = [auto_row(False, extend_tokens=700), auto_row(False, extend_tokens=300, decodes=9)]
    assert prefill_tokens(rows) == 700


def test_the_gate_learns_round_costs_from_the_shared_clock() -> None:
    gate, _ = learned()
    assert gate.cost.decode_ms == pytest.approx(DECODE_MS)
    assert gate.cost.step_ms(2000) == pytest.approx(20.0 + 0.15 * 2000, rel=1e-3)


def backlog_rounds(gate: AutoGate, t: int, rounds: int) -> list[bool]:
    """``rounds`` rounds of one rank always holding a prompt (the other only decoding), the
    prompt extended whenever the gate opens; the votes."""
    opened = []
    for _ in range(rounds):
        vote = gate.vote([auto_row(True, head=1, now=t), auto_row(False, now=t)])
        tokens = 200 if vote.open else 0
        rows = [auto_row(True, extend_tokens=tokens, head=1, now=t), auto_row(False, now=t)]
        gate.observe(rows, read_rows(rows))
        opened.append(vote.open)
        t += DECODE_MS
    return opened


def test_steady_backlog_opens_every_third_round() -> None:
    """Two decode rounds per window: a rank that always wants prefill (the other never)."""
    opened = backlog_rounds(*learned(), 20)
    at = [i for i, o in enumerate(opened) if o]
    # Once the banked credit is spent, one window every third round.
    assert [b - a for a, b in itertools.pairwise(at)][-3:] == [3, 3, 3]


def test_banked_credit_lets_a_burst_in_sooner_but_never_back_to_back() -> None:
    opened = backlog_rounds(*learned(), 10)  # after a quiet spell: two windows banked
    # Every other round while the credit lasts, then the pace of one window in three.
    assert opened == [True, False, True, False, True, False, True, False, False, True]


def test_all_point_opens_without_waiting_for_any_budget() -> None:
    gate, t = learned()
    # Both ranks decode and hold a 40k prompt that arrived this round: ALL, no wait.
    rows = [auto_row(True, head_tokens=40_000, now=t) for _ in range(2)]
    vote = gate.vote(rows)
    assert vote.open and vote.point == "all" and vote.reason == "all"


def test_an_idle_group_opens_at_once() -> None:
    gate = AutoGate(AutoGateConfig())
    vote = gate.vote([auto_row(True, decodes=0, head_tokens=40_000), auto_row(False, decodes=0)])
    assert vote.open and vote.reason == "idle"


def wait_until_open(gate: AutoGate, t: int, head_tokens: int, backlog: int | None = None) -> int:
    """Decode rounds (one rank holding a prompt, the other decoding only) until the gate
    opens; returns the held prompt's age (ms) at the vote that opened. The prompt was first
    published in the last round before this loop (its head count runs from there), which
    began one decode round before ``t``."""
    for head in range(1, 10_000):
        now = t + (head - 1) * DECODE_MS
        rows = [
            auto_row(True, head_tokens=head_tokens, head=head, now=now, backlog=backlog),
            auto_row(False, now=now),
        ]
        vote = step(gate, rows)
        if vote.open:
            assert vote.reason == "budget"
            return (head + 1) * DECODE_MS
    raise AssertionError("never opened")


def test_a_short_prompt_in_a_fast_window_opens_at_the_first_vote() -> None:
    gate, t = learned()
    # 230 tokens: a 54.5 ms step, a fast window (84.5 ms < 200); budget 0.5 x 54.5 ms, less
    # than the 60 ms the prompt is old at the first vote.
    assert wait_until_open(gate, t, head_tokens=230) == 2 * DECODE_MS


def test_a_long_prompt_waits_half_its_own_prefill_for_the_others() -> None:
    gate, t = learned()
    own = 20.0 + 0.15 * 40_000  # 6,020 ms
    age = wait_until_open(gate, t, head_tokens=40_000)
    assert 0.5 * own <= age < 0.5 * own + 2 * DECODE_MS


def test_a_slow_window_waits_for_three_quarters_of_the_ttft_slack() -> None:
    gate, t = learned()
    # Head 800 tokens (140 ms), backlog 1,500 (a 245 ms step: 275 ms > the 200 ms ITL SLO).
    age = wait_until_open(gate, t, head_tokens=800, backlog=1500)
    slack = 2000.0 - (20.0 + 0.15 * 800)
    assert 0.75 * slack <= age < 0.75 * slack + 2 * DECODE_MS
    # The same backlog under a looser ITL SLO is a fast window: half its own 140 ms prefill.
    loose, t = learned(itl_slo_ms=400.0)
    assert wait_until_open(loose, t, head_tokens=800, backlog=1500) == 3 * DECODE_MS


def test_liveness_bounds_every_wait() -> None:
    gate, t = learned(max_wait_ms=300.0)
    age = wait_until_open_any(gate, t)
    assert 300.0 <= age < 300.0 + 2 * DECODE_MS


def wait_until_open_any(gate: AutoGate, t: int) -> int:
    for head in range(1, 1000):
        now = t + (head - 1) * DECODE_MS
        rows = [auto_row(True, head_tokens=40_000, head=head, now=now), auto_row(False, now=now)]
        vote = step(gate, rows)
        if vote.open:
            assert vote.reason == "liveness"
            return (head + 1) * DECODE_MS
    raise AssertionError("never opened")


@pytest.mark.parametrize(("hold", "waits"), [(2, 1), (0, 0)])
def test_liveness_keeps_two_windows_apart(hold: int, waits: int) -> None:
    """A prompt past the bound, met right after a window, waits that one round (with any hold
    asked for): back-to-back windows give the streams of a rank extending in both one gap of
    two chunk rounds, and under a steady stream of long prompts they would run every round."""
    gate, t = learned(max_wait_ms=300.0, hold_rounds=hold)
    head = 40  # rounds: far past 300 ms
    window = step(
        gate, [auto_row(True, extend_tokens=4000, head=head, now=t), auto_row(False, now=t)]
    )
    assert window.open and window.reason == "liveness"
    t += DECODE_MS + 620
    for held in range(waits + 1):
        head += 1
        vote = step(gate, [auto_row(True, head=head, now=t), auto_row(False, now=t)])
        assert vote.open == (held == waits), (held, vote)
        t += DECODE_MS
    assert vote.reason == "liveness"


def at(row: RankRow, now: int) -> RankRow:
    """``row`` gathered at ``now`` (its ``now_ms`` column replaced)."""
    ints = list(row.pack())
    ints[len(ROW_COLUMNS) + 2] = now
    return RankRow.unpack(ints)


def after_a_run(gate: AutoGate, t: int, run: list[list[RankRow]]) -> tuple[bool, str | None]:
    """The vote on the last of ``run``'s extend rounds (each a round's gathered rows, 700 ms
    apart on the shared clock), as the rank loop asks it: after observing them."""
    vote = None
    for i, rows in enumerate(run):
        rows = [at(row, t + 700 * i) for row in rows]
        gate.observe(rows, read_rows(rows))
        vote = gate.vote(rows)
    return vote.open, vote.reason


# A rank mid-burst: its round is all extend, its first decodes are waiting for the next one.
BURST = RankRow(4000, 1, 1, True, True, auto_row(True).extras)
MIXED = auto_row(True, decodes=1, extend_tokens=4000)  # one decode beside its extend
DECODING = auto_row(False, decodes=8)  # a rank that only decodes, holding no prompt


@pytest.mark.parametrize(
    ("run", "config", "opens"),
    [
        # Every rank mid-burst, nobody decoding: the 650 ms round is slow, the run goes on.
        ([[BURST, BURST]], {}, True),
        ([[BURST, BURST]] * 2, {}, True),
        # ... but not past the TTFT bound (three 700 ms rounds measured, one estimated).
        ([[BURST, BURST]] * 4, {}, False),
        # A fast round (650 ms within a 1 s ITL bound): the gap rule keeps windows apart.
        ([[BURST, BURST]], {"itl_slo_ms": 1000.0}, False),
        # Most of the group's decodes sit on a rank that would get a second slow gap.
        ([[MIXED, DECODING]], {}, False),
        # The ranks still extending hold most decodes: the run spares them a second gap.
        ([[MIXED, MIXED, auto_row(False, decodes=1)]], {}, True),
    ],
)
def test_a_slow_run_goes_on_while_it_spares_most_streams(run, config: dict, opens: bool) -> None:
    gate, t = learned(**config)
    assert after_a_run(gate, t, run)[0] is opens


def windows_in(gate: AutoGate, t: int, rounds: int, fixed: float) -> list[int]:
    """``rounds`` rounds in which both ranks decode and hold a short prompt (an ALL point
    every round), a window costing ``fixed`` + 0.15 ms a token more; the rounds whose vote
    opened."""
    opened = []
    for i in range(rounds):
        rows = [auto_row(True, head=1, now=t) for _ in range(2)]
        if gate.vote(rows).open:
            opened.append(i)
            rows = [auto_row(True, extend_tokens=200, head=1, now=t) for _ in range(2)]
            t += round(fixed + 0.15 * 200)
        gate.observe(rows, read_rows(rows))
        t += DECODE_MS
    return opened


@pytest.mark.parametrize(
    ("fixed", "spacing"),
    [
        # A 20 ms fixed step beside 30 ms decode rounds: the hold of two rounds stands.
        (20.0, 3),
        # A 200 ms fixed step (an extend overhead like GB200's): seven decode rounds, as long
        # as the window's fixed part, between windows.
        (200.0, 8),
    ],
)
def test_the_hold_pays_for_a_windows_fixed_cost(fixed: float, spacing: int) -> None:
    # An ITL bound no window reaches: only the pace spaces the windows.
    gate, t = learned(fixed=fixed, itl_slo_ms=10_000.0)
    opened = windows_in(gate, t, 60, fixed)
    assert [b - a for a, b in itertools.pairwise(opened)][-3:] == [spacing] * 3


@pytest.mark.parametrize(
    ("config", "flag"),
    [
        ({"max_wait_ms": 0.0}, "--prefill-max-wait-ms"),
        ({"max_wait_ms": "soon"}, "--prefill-max-wait-ms"),
        ({"hold_rounds": -1}, "--prefill-auto-hold-rounds"),
        ({"hold_rounds": 1.5}, "--prefill-auto-hold-rounds"),
        ({"wait_ratio": -0.1}, "--prefill-auto-wait-ratio"),
        ({"ttft_slo_ms": 0}, "--prefill-auto-ttft-slo-ms"),
        ({"itl_slo_ms": float("nan")}, "--prefill-auto-itl-slo-ms"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(config: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        AutoGateConfig(**config)


def test_server_args_refuse_a_bad_budget_naming_the_flag(capsys) -> None:
    from roundgate.actors.server_args import ServerArgs

    with pytest.raises(ValueError, match="--prefill-max-wait-ms"):
        ServerArgs(dp_size=2, prefill_policy="roundgate-auto", prefill_max_wait_ms=-1.0)
    with pytest.raises(SystemExit):
        parse_server_args(["--prefill-policy", "roundgate-auto", "--prefill-max-wait-ms", "x"])
    assert "--prefill-max-wait-ms" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--prefill-max-wait-ms applies to --prefill-policy"):
        ServerArgs(dp_size=2, prefill_policy="none", prefill_max_wait_ms=100.0)


SPEC = make_spec(num_requests=80, rate=30.0, input_len=120, output_len=24)


def test_the_liveness_bound_holds_in_the_real_loop() -> None:
    """In the simulator's round loop: a gate told to hold for ever still admits every prompt
    within the liveness bound, and a looser bound lets the same prompts wait longer."""
    costs = PRESETS["h100-dsv3"]
    tight = simulate(
        "roundgate-auto",
        SPEC,
        costs=costs,
        prefill_auto_hold_rounds=10_000,
        prefill_max_wait_ms=100.0,
    )
    loose = simulate(
        "roundgate-auto",
        SPEC,
        costs=costs,
        prefill_auto_hold_rounds=10_000,
        prefill_max_wait_ms=1000.0,
    )
    assert tight["unfinished"] == 0 and loose["unfinished"] == 0
    assert 1 <= tight["max_admission_wait_rounds"] < loose["max_admission_wait_rounds"]
