"""Scheduler retraction under KV pressure and readmission, as the gate's permission allows."""

from __future__ import annotations

import pytest
from builders import make_scheduler
from scheduler_rounds import add, chunk_summary, decoding, fill_pool, pressured_trio, run_round

from roundgate.actors.control.request import Request, RequestStatus, SamplingParams
from roundgate.actors.control.scheduler import Scheduler
from roundgate.gate.permission import ALLOW_ALL, HOLD_ALL

# --- retraction and readmission -------------------------------------------------------------------


def test_retraction_under_kv_pressure_picks_the_newest() -> None:
    sched, a, b, c = pressured_trio()
    old_pages = list(c.page_ids)
    plan = sched.plan(HOLD_ALL)
    assert [(r.request_id, pages) for r, pages in plan.retracted] == [(c.request_id, old_pages)]
    assert c.status is RequestStatus.RETRACTED and c.page_ids == []
    assert sched.queues.running == [a, b] and list(sched.queues.retracted) == [c]
    assert chunk_summary(plan) == [(a.request_id, 1, False), (b.request_id, 1, False)]
    assert sched.num_retractions == 1 and len(a.page_ids) == 2
    sched.pool.check_integrity()


def test_readmission_runs_with_the_gate_closed_and_is_a_restore() -> None:
    sched, a, b, c = pressured_trio()
    run_round(sched, HOLD_ALL)  # c retracted; b samples its 2nd (last) token and finishes
    assert b.status is RequestStatus.FINISHED_LENGTH and c.status is RequestStatus.RETRACTED
    computed = c.num_computed_tokens
    plan = run_round(sched, HOLD_ALL)
    assert plan.readmitted == [c] and plan.permission == HOLD_ALL
    assert plan.num_extends == 0, "a restore takes no prefill tokens"
    assert c.status is RequestStatus.DECODING and c in sched.queues.running
    # Restored with its cached tokens, then decoded as usual in the same round.
    assert chunk_summary(plan) == [(a.request_id, 1, False), (c.request_id, 1, False)]
    assert c.num_computed_tokens == computed + 1


def test_readmission_waits_for_room_then_restores_fifo() -> None:
    sched, a, b, c = pressured_trio(b_max_tokens=16)  # b keeps decoding
    run_round(sched, HOLD_ALL)  # c retracted so that a gets its second page
    plan = run_round(sched, HOLD_ALL)
    # No free page for c. b now needs a second page too and, being the newest, retracts itself.
    assert plan.readmitted == [] and [r for r, _ in plan.retracted] == [b]
    assert list(sched.queues.retracted) == [c, b]
    sched.abort(a.request_id)  # frees a's two pages: both fit again
    plan = run_round(sched, HOLD_ALL)
    assert plan.readmitted == [c, b] and plan.num_extends == 0


def resident_chunk_before_a_decode() -> tuple[Scheduler, Request, Request]:
    """Drive a 4-page pool (4 tokens a page, budget 4) into this state:

        running = [p (resident chunk: 4 of 5 prompt tokens, its one page full),
                   d (decoding, newer: 10 tokens in 3 pages, room for its next token)]
        free pages = 0

    A resident chunk older than a decode only arises through readmission order: d and p were
    both retracted under decode pressure (p first) and came back in that order.
    """
    sched = make_scheduler(page_size=4, num_kv_pages=4, max_scheduled_tokens=4)
    req_ids = ("x", "d", "p")
    for rid, (prompt_len, max_tokens) in zip(req_ids, [(3, 3), (8, 6), (5, 6)], strict=True):
        sched.add_request(Request(rid, [7] * prompt_len, SamplingParams(max_tokens=max_tokens)))
    for permission in (ALLOW_ALL, ALLOW_ALL, ALLOW_ALL, HOLD_ALL, ALLOW_ALL, ALLOW_ALL):
        run_round(sched, permission)
    p, d = sched.queues.running
    assert (p.request_id, d.request_id) == ("p", "d")
    assert p.status is RequestStatus.PREFILLING and p.num_computed_tokens == 4
    assert len(p.page_ids) == 1 and d.status is RequestStatus.DECODING
    assert sched.pool.num_free_pages == 0 and sched.pool.can_fit("d", d.num_tokens)
    return sched, p, d


def test_retraction_obeys_the_gate_closed() -> None:
    """An ineligible (gate-closed) resident chunk neither retracts anyone nor gets pages."""
    sched, p, _ = resident_chunk_before_a_decode()
    pages = list(p.page_ids)
    retractions = sched.num_retractions
    plan = run_round(sched, HOLD_ALL)
    assert plan.retracted == [] and sched.num_retractions == retractions
    assert p.page_ids == pages and p.num_computed_tokens == 4
    assert chunk_summary(plan) == [("d", 1, False)]


def test_retraction_obeys_the_gate_open() -> None:
    """With permission, a resident chunk with no room retracts the newest other request."""
    sched, p, d = resident_chunk_before_a_decode()
    d_pages = list(d.page_ids)
    plan = run_round(sched, ALLOW_ALL)
    assert [(r.request_id, pages) for r, pages in plan.retracted] == [("d", d_pages)]
    assert chunk_summary(plan) == [("p", 1, True)]
    assert len(p.page_ids) == 2 and p.status is RequestStatus.DECODING


@pytest.mark.parametrize("mixed", [False, True])
def test_new_prompt_never_triggers_retraction(mixed: bool) -> None:
    # Three requests decode inside their own pages and fill the pool; a new prompt may not
    # take pages from them, even with the gate open.
    sched = make_scheduler(page_size=4, num_kv_pages=3, enable_mixed_prefill_decode=mixed)
    decoding(sched, 2, 2, 2)
    (new,) = add(sched, 2)
    plan = run_round(sched, ALLOW_ALL)
    assert plan.retracted == [] and plan.num_extends == 0 and plan.num_decodes == 3
    assert new.status is RequestStatus.WAITING


def test_new_prompt_below_the_watermark_does_not_retract_for_room() -> None:
    # 10 pages, 9 used (0.9, at the watermark): the prompt gets only the one free page. A free
    # batch slot makes this a prefill round (non-mixed: the decodes wait), so no decode grows.
    sched = make_scheduler(page_size=4, num_kv_pages=10, max_scheduled_tokens=64, max_num_seqs=8)
    decoding(sched, 8, 8, 8, 8)  # 2 pages each (8 prompt + 1 sampled needs a 3rd later)
    fill_pool(sched, 1)
    (new,) = add(sched, 12)
    plan = sched.plan(ALLOW_ALL)
    assert plan.retracted == []
    assert chunk_summary(plan) == [(new.request_id, 4, True)]


def test_a_request_that_outgrows_the_whole_pool_finishes_instead_of_waiting_forever() -> None:
    # 2 pages of 4 tokens under a 4096-token context: the pool caps the sequence (8 tokens).
    sched = make_scheduler(page_size=4, num_kv_pages=2)
    (req,) = add(sched, (4, 100))
    for _ in range(20):
        if req.is_finished:
            break
        run_round(sched, ALLOW_ALL)
    assert req.status is RequestStatus.FINISHED_LENGTH and req.num_tokens == 8
    assert sched.pool.num_used_pages == 0 and not sched.has_unfinished
