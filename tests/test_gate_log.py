"""The per-window log record: one per opened window that admitted prefill, none otherwise."""

from __future__ import annotations

import json
import logging

import pytest

from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.control.round import RoundPlan, RoundResult
from roundgate.actors.telemetry.gate_log import gate_window_record, log_gate_window
from roundgate.gate.rows import RankRow, read_rows
from roundgate.gate.vote import OPEN, GateVote


def outcome(vote: GateVote, rows: list[RankRow]) -> RoundOutcome:
    return RoundOutcome(vote, RoundPlan(), rows, read_rows(rows), RoundResult())


PREFILL = RankRow(300, 2, 2, False, True)
DECODE = RankRow(4, 4, 0, True, True)


@pytest.mark.parametrize(
    ("vote", "rows", "expected"),
    [
        (
            GateVote(True, "all"),
            [PREFILL, PREFILL],
            {"point": "all", "ranks": [0, 1], "prefill_tokens": 600, "extends": 4},
        ),
        (
            GateVote(True, "any"),
            [PREFILL, DECODE],
            {"point": "any", "ranks": [0], "prefill_tokens": 300, "extends": 2},
        ),
        # A policy that opens with no attempt point (the local interval, the peers).
        (
            OPEN,
            [DECODE, PREFILL],
            {"point": "local", "ranks": [1], "prefill_tokens": 300, "extends": 2},
        ),
        (GateVote(True, "all"), [DECODE, DECODE], None),  # opened, nothing admitted
        (GateVote(False, None), [DECODE, DECODE], None),
        # SGLang's DELAY lets resident chunks run: extends, but no window was opened.
        (GateVote(False, None, chunks=True, reason="delay"), [PREFILL, DECODE], None),
    ],
)
def test_window_record(vote, rows, expected) -> None:
    record = gate_window_record(outcome(vote, rows), 17, "g")
    if expected is None:
        assert record is None
    else:
        assert record == {"event": "gate_window", "group": "g", "round": 17, **expected}


def test_one_json_line_per_window(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="roundgate.gate"):
        log_gate_window(outcome(GateVote(True, "any"), [PREFILL, DECODE]), 3, "g")
        log_gate_window(outcome(GateVote(False, None), [DECODE, DECODE]), 4, "g")
    assert len(caplog.records) == 1
    assert json.loads(caplog.records[0].getMessage())["round"] == 3
