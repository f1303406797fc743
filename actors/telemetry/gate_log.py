"""One structured log line per gate window (off by default: ``--log-gate-windows``)."""

from __future__ import annotations

import json
import logging

from roundgate.actors.control.rank_loop import RoundOutcome

logger = logging.getLogger("roundgate.gate")


def gate_window_record(outcome: RoundOutcome, round_index: int, group: str) -> dict | None:
    """The window this round opened, or None: a vote that opened and admitted some prefill.

    ``prefill_tokens`` is the tokens of the extending ranks' batches (their decodes included
    when mixed batches are on), as the gathered rows carry them.
    """
    vote = outcome.vote
    if not (vote.open and outcome.view.any_extend):
        return None
    ranks = [i for i, row in enumerate(outcome.rows) if row.num_extends > 0]
    return {
        "event": "gate_window",
        "group": group,
        "round": round_index,
        "point": vote.point or "local",
        "ranks": ranks,
        "prefill_tokens": sum(outcome.rows[i].num_tokens for i in ranks),
        "extends": sum(outcome.rows[i].num_extends for i in ranks),
    }


def enable() -> None:
    """Send the window lines to stderr (the replica's log) at INFO, whatever the root level."""
    import sys

    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log_gate_window(outcome: RoundOutcome, round_index: int, group: str) -> None:
    record = gate_window_record(outcome, round_index, group)
    if record is not None:
        logger.info(json.dumps(record, separators=(",", ":")))
