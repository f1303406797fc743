"""A full group round in which the ranks with no prefill work skip the plan objects.

A round the fast path cannot skip (someone extends, a prompt is about to be admitted) still
runs the real ``RankLoop`` on the ranks that have prefill work. A rank with none (nothing
waiting, no resident chunk, nothing retracted or aborting) can only decode every running
request, whatever the vote, so its round is known without building a plan: the same pool
steps in the same order (key a filled page, take the next), the same row, the same price and
the same token events (``steady_rank.plan_decode_round`` and ``update_decode_round``). ``step``
does that for those ranks and calls ``begin``/``finish`` for the others;
``tests/test_fast_forward.py`` compares whole runs with the full rounds.

Only for steady policies (``PrefillPolicy.steady``, ``fast_forward.supported``): their votes
change no state, so skipping a decode rank's vote is exact, and they read no extra column.
"""

from __future__ import annotations

from collections.abc import Sequence

from roundgate.actors.control.rank_loop import RankLoop
from roundgate.actors.control.round import TokenEvent
from roundgate.gate.rows import RankRow, RoundView, read_rows
from roundgate.sim import steady_rank
from roundgate.sim.cost_executor import SIM_TOKEN
from roundgate.sim.round_costs import RoundCosts

# A decoding rank's row by batch size: (n, n, 0, no prefill wanted, decode work iff n).
_ROWS: dict[int, RankRow] = {}


def _row(n: int) -> RankRow:
    row = _ROWS.get(n)
    if row is None:
        row = _ROWS[n] = RankRow(n, n, 0, False, n > 0)
    return row


def step(
    loops: Sequence[RankLoop], costs: RoundCosts
) -> tuple[RoundView, list[float], list[list[TokenEvent]]]:
    """One group round: its reading, each rank's forward seconds and its token events."""
    plans = []
    rows = []
    for loop in loops:
        decodes = steady_rank.plan_decode_round(loop.scheduler)
        plans.append(decodes)
        rows.append(loop.begin() if decodes is None else _row(len(decodes)))
    view = read_rows(rows)
    costs_s = []
    events = []
    per_kv = costs.decode_per_kv_token_ms
    for loop, decodes in zip(loops, plans, strict=True):
        if decodes is None:
            outcome = loop.finish(rows, view)
            costs_s.append(outcome.result.cost_s)
            events.append(outcome.events)
            continue
        loop.policy.observe(rows, view)
        loop.last_rows = rows
        if view.all_idle or not decodes:
            costs_s.append(0.0)  # no forward, or an idle one: it costs nothing of its own
            events.append([])
            continue
        # ``CostExecutor``'s price: a decode at position ``start`` attends over ``start``.
        kv = sum(start for _, start in decodes) if per_kv else 0
        costs_s.append(costs.rank_ms(len(decodes), 0, kv) / 1000.0)
        events.append(steady_rank.update_decode_round(loop.scheduler, decodes, SIM_TOKEN))
    return view, costs_s, events
