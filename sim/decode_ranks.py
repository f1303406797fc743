"""A full group round in which the ranks with no prefill work skip the plan objects.

A round the fast path cannot skip (someone extends, a prompt is about to be admitted) still
runs the real ``RankLoop`` on the ranks that have prefill work. A rank with none (nothing
waiting, no resident chunk, nothing retracted or aborting) can only decode every running
request, whatever the vote, so its round is known without building a plan: the same pool
steps in the same order (key a filled page, take the next), the same row, the same price and
the same token events. ``step`` does that for those ranks and calls ``begin``/``finish`` for
the others; ``tests/test_fast_forward.py`` compares whole runs with the full rounds.

Only for the steady policies (``steady_policies.STEADY_POLICIES``): their votes change no
state, so skipping a decode rank's vote is exact, and they read no extra column.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.control.rank_loop import RankLoop
from actors.control.request import Request, RequestStatus
from actors.control.round import TokenEvent
from actors.control.scheduler import Scheduler
from gate import RankRow, RoundView, read_rows
from sim.cost_executor import SIM_TOKEN
from sim.round_costs import RoundCosts

# A decoding rank's row by batch size: (n, n, 0, no prefill wanted, decode work iff n).
_ROWS: dict[int, RankRow] = {}
_DECODING = RequestStatus.DECODING


def _decodes(s: Scheduler) -> list[tuple[Request, int]] | None:
    """Plan the decodes of a rank with no prefill work (``Scheduler.plan``'s outcome for
    it): (request, start) in running order, pages granted; None when the rank has other
    work or a decode would need a retraction (the real plan decides those)."""
    if s.waiting or s._partial or s.retracted or s._pending_aborts or s._aborted_events:
        return None
    running = s.running
    if len(running) > s.args.max_scheduled_tokens:
        return None  # the budget would cut the decodes short
    pool = s.pool
    page_size = pool.page_size
    new_pages = 0
    for req in running:
        need = req.num_prompt_tokens + len(req.output_token_ids)
        if need > len(req.page_ids) * page_size:
            new_pages += pool.pages_for(need) - len(req.page_ids)
    if new_pages > pool.num_free_pages:
        return None
    s.round += 1
    keep = s.prefix.enabled
    decodes = []
    for req in running:
        computed = req.num_computed_tokens
        need = req.num_prompt_tokens + len(req.output_token_ids)
        if need > len(req.page_ids) * page_size:
            if keep:
                s.prefix.keep_last_page(req)
            pool.grow(req.request_id, need)
        decodes.append((req, computed))
        req.num_computed_tokens = computed + 1
    return decodes


def _row(n: int) -> RankRow:
    row = _ROWS.get(n)
    if row is None:
        row = _ROWS[n] = RankRow(n, n, 0, False, n > 0)
    return row


def _sample(s: Scheduler, decodes: list[tuple[Request, int]]) -> list[TokenEvent]:
    """``Scheduler.update`` for a decode-only plan: a token each, finishing at the length
    limit (the finished request keys its last full page, then frees its pages)."""
    events = []
    max_len = s.max_sequence_len
    keep = s.prefix.enabled
    make_event = tuple.__new__
    for req, _ in decodes:
        req.status = _DECODING
        finished = req.append_token(SIM_TOKEN, max_len)
        if finished:
            if keep:
                s.prefix.keep_last_page(req)
            s.running.remove(req)
            s.pool.free(req.request_id)
            s._finish(req)
        events.append(make_event(TokenEvent, (req, SIM_TOKEN, finished)))
    return events


def step(
    loops: Sequence[RankLoop], costs: RoundCosts
) -> tuple[RoundView, list[float], list[list[TokenEvent]]]:
    """One group round: its reading, each rank's forward seconds and its token events."""
    plans = []
    rows = []
    for loop in loops:
        decodes = _decodes(loop.scheduler)
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
        events.append(_sample(loop.scheduler, decodes))
    return view, costs_s, events
