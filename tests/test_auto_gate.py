"""``roundgate-auto``: the gate's points plus three early openings, as functions of rows."""

from __future__ import annotations

import pytest
from sim_builders import make_spec, simulate

from gate import RankRow, read_rows
from gate.auto import AutoGate, AutoGateConfig
from sim.round_costs import PRESETS


def auto_row(
    want: bool,
    decodes: int = 4,
    extends: int = 0,
    backlog: int = 1,
    rounds: int = 1,
    head: int = 0,
    now: int = 0,
) -> RankRow:
    """A rank's row with the auto gate's columns (backlog requests, backlog rounds, head wait
    rounds, now ms)."""
    b = backlog if want else 0
    r = rounds if want else 0
    return RankRow(
        decodes + extends, decodes + extends, extends, want, decodes > 0, (b, r, head, now)
    )


def step(gate: AutoGate, rows: list[RankRow]):
    vote = gate.vote(rows)
    gate.observe(rows, read_rows(rows))
    return vote


def decode_rounds(gate: AutoGate, start: int, count: int, ms: int, want=(False, False)):
    """``count`` decode-only rounds of ``ms`` each from ``start``; returns the next start."""
    t = start
    for _ in range(count):
        step(gate, [auto_row(w, now=t) for w in want])
        t += ms
    return t


def test_budget_opens_before_the_oldest_prompt_passes_it() -> None:
    gate = AutoGate(AutoGateConfig(attempt_interval=4, any_interval=64, max_wait_ms=200.0))
    t = decode_rounds(gate, 0, 3, 30)  # decode rounds cost 30 ms
    rows = lambda head, now: [auto_row(True, head=head, now=now), auto_row(False, now=now)]  # noqa: E731
    # Held 1 round (30 ms + the next decode + the assumed 60 ms extend < 200): not yet. The
    # amortized rule needs (60 - 30) ms x 8 decodes = 240 ms of held time: not yet either.
    vote = step(gate, rows(1, t))
    assert not vote.open
    t += 30
    votes = []
    for head in range(2, 8):
        votes.append(step(gate, rows(head, t)))
        t += 30
    first_open = next(i for i, v in enumerate(votes) if v.open)
    assert votes[first_open].reason in ("budget", "amortized")
    # Opened by the time age + next decode + extend reached 200 ms: age <= 110 ms.
    assert (first_open + 2) * 30 <= 110 + 30


def test_the_budget_alone_opens_when_decodes_make_holding_cheap() -> None:
    """Many decodes make the amortized rule wait; the budget still caps the hold."""
    gate = AutoGate(AutoGateConfig(attempt_interval=64, any_interval=64, max_wait_ms=150.0))
    t = decode_rounds(gate, 0, 3, 20)
    reasons = []
    for head in range(1, 10):
        rows = [auto_row(True, decodes=500, head=head, now=t), auto_row(False, decodes=500, now=t)]
        reasons.append(step(gate, rows).reason)
        t += 20
    assert "budget" in reasons and "amortized" not in reasons


def test_saturation_guard_keeps_the_gate_open_until_the_backlog_fits() -> None:
    gate = AutoGate(AutoGateConfig(attempt_interval=64, any_interval=64, max_wait_ms=10_000.0))
    t = decode_rounds(gate, 0, 2, 30)
    # An extend round that leaves backlog behind on the rank that extended.
    step(gate, [auto_row(True, extends=1, now=t), auto_row(False, now=t)])
    assert gate.saturated
    vote = step(gate, [auto_row(True, head=1, now=t + 90), auto_row(False, now=t + 90)])
    assert vote.open and vote.reason == "saturated"
    # Backlog gone: the guard lets go and the gate holds again.
    step(gate, [auto_row(False, now=t + 120), auto_row(False, now=t + 120)])
    assert not gate.saturated
    vote = step(gate, [auto_row(True, head=0, now=t + 150), auto_row(False, now=t + 150)])
    assert not vote.open


@pytest.mark.parametrize(("backlog", "saturated"), [(4, True), (1, False)])
def test_a_backlog_longer_than_one_round_budget_is_saturation(backlog: int, saturated) -> None:
    """Several prompts needing more than one round's budget: saturation. One long prompt
    (chunked over rounds anyway) is not."""
    gate = AutoGate(AutoGateConfig(attempt_interval=64, any_interval=64, max_wait_ms=10_000.0))
    step(gate, [auto_row(True, backlog=backlog, rounds=3, now=0), auto_row(False, now=0)])
    assert gate.saturated is saturated


def test_round_costs_are_measured_from_the_shared_clock() -> None:
    gate = AutoGate(AutoGateConfig())
    step(gate, [auto_row(False, now=0), auto_row(False, now=0)])
    step(gate, [auto_row(False, extends=1, now=30), auto_row(False, now=30)])
    step(gate, [auto_row(False, now=130), auto_row(False, now=130)])
    assert gate.decode_ms == 30.0 and gate.extend_ms == 100.0


@pytest.mark.parametrize(
    ("config", "flag"),
    [
        ({"max_wait_ms": 0.0}, "--prefill-max-wait-ms"),
        ({"max_wait_ms": -5}, "--prefill-max-wait-ms"),
        ({"max_wait_ms": "soon"}, "--prefill-max-wait-ms"),
        ({"attempt_interval": 0}, "--prefill-auto-attempt-interval"),
        ({"any_interval": 2, "attempt_interval": 4}, "--prefill-auto-any-interval"),
        ({"any_interval": 1.5}, "--prefill-auto-any-interval"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(config: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        AutoGateConfig(**config)


def test_server_args_refuse_a_bad_budget_naming_the_flag(capsys) -> None:
    from actors.server_args import ServerArgs

    with pytest.raises(ValueError, match="--prefill-max-wait-ms"):
        ServerArgs(dp_size=2, prefill_policy="roundgate-auto", prefill_max_wait_ms=-1.0)
    with pytest.raises(SystemExit):
        ServerArgs.from_cli(["--prefill-policy", "roundgate-auto", "--prefill-max-wait-ms", "x"])
    assert "--prefill-max-wait-ms" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--prefill-max-wait-ms applies to --prefill-policy"):
        ServerArgs(dp_size=2, prefill_policy="none", prefill_max_wait_ms=100.0)


SPEC = make_spec(num_requests=80, rate=30.0, input_len=120, output_len=24)


def test_the_any_bound_holds_with_the_budget() -> None:
    """In the real loop: no prompt waits more than the ANY interval for the auto gate, and a
    budget below one round opens the gate for every held prompt at once."""
    costs = PRESETS["h100-dsv3"]
    bounded = simulate(
        "roundgate-auto", SPEC, costs=costs, prefill_auto_any_interval=6, prefill_max_wait_ms=1e6
    )
    assert 1 <= bounded["max_admission_wait_rounds"] <= 6
    tight = simulate("roundgate-auto", SPEC, costs=costs, prefill_max_wait_ms=1.0)
    assert tight["max_admission_wait_rounds"] <= 1
