"""Scheduler scenario tables: the probe's watermark rule, the plan under the gate's permission,
chunking, mixed vs non-mixed batches, retraction and readmission, aborts and bookkeeping."""

from __future__ import annotations

import itertools

import pytest
from builders import make_args, make_request, make_scheduler

from actors.control.request import Request, RequestStatus, SamplingParams
from actors.control.round import RoundKind, RoundPlan, RoundResult
from actors.control.scheduler import Probe, Scheduler
from gate.permission import ALLOW_ALL, CHUNKS_ONLY, HOLD_ALL, NEW_ONLY, Permission

# --- builders -------------------------------------------------------------------------------------

_ids = itertools.count()


def add(sched: Scheduler, *prompts: tuple[int, int] | int, loading: bool = False) -> list[Request]:
    """Queue requests given as ``prompt_len`` or ``(prompt_len, max_tokens)``."""
    reqs = []
    for spec in prompts:
        prompt_len, max_tokens = spec if isinstance(spec, tuple) else (spec, 16)
        req = make_request(f"r{next(_ids)}", prompt_len, max_tokens)
        sched.add_request(req, loading=loading)
        reqs.append(req)
    return reqs


def sampled(plan: RoundPlan, token: int = 0) -> RoundResult:
    """The executor's answer: ``token`` for every chunk that samples."""
    return RoundResult({c.request.request_id: token for c in plan.chunks if c.samples})


def run_round(sched: Scheduler, permission: Permission, token: int = 0) -> RoundPlan:
    """plan + update, as one rank's round without the gather."""
    plan = sched.plan(permission)
    sched.update(plan, sampled(plan, token))
    sched.pool.check_integrity()
    return plan


def fill_pool(sched: Scheduler, num_pages: int) -> None:
    """Occupy pages with a ballast owner that is not a request (pressure from elsewhere)."""
    assert sched.pool.allocate("ballast", num_pages * sched.pool.page_size) is not None


def chunk_summary(plan: RoundPlan) -> list[tuple[str, int, bool]]:
    return [(c.request.request_id, c.num_tokens, c.is_prefill) for c in plan.chunks]


def decoding(sched: Scheduler, *prompts: tuple[int, int] | int) -> list[Request]:
    """Requests that have finished prefill (one token sampled) and now decode."""
    reqs = add(sched, *prompts)
    run_round(sched, ALLOW_ALL)
    assert all(r.status is RequestStatus.DECODING for r in reqs)
    return reqs


# --- the probe: wants_prefill under the watermark -------------------------------------------------


@pytest.mark.parametrize(
    ("used_pages", "resident", "new_prompt", "loading", "wants"),
    [
        pytest.param(0, False, False, False, False, id="nothing-queued"),
        pytest.param(0, False, True, False, True, id="new-prompt-empty-pool"),
        pytest.param(90, False, True, False, True, id="new-prompt-at-0.90"),
        pytest.param(91, False, True, False, False, id="new-prompt-above-0.90"),
        pytest.param(100, False, True, False, False, id="new-prompt-full-pool"),
        pytest.param(0, False, True, True, True, id="loading-prompt-is-new-work"),
        pytest.param(91, False, True, True, False, id="loading-prompt-above-0.90"),
        pytest.param(8, True, False, False, True, id="resident-chunk"),
        pytest.param(91, True, False, False, True, id="resident-chunk-above-0.90"),
        pytest.param(100, True, True, False, True, id="resident-and-new-full-pool"),
    ],
)
def test_probe_wants_prefill_watermark(
    used_pages: int, resident: bool, new_prompt: bool, loading: bool, wants: bool
) -> None:
    # 100 pages of one token: occupancy is exactly used_pages / 100.
    sched = make_scheduler(page_size=1, num_kv_pages=100, max_scheduled_tokens=8)
    if resident:
        # 8 of 12 prompt tokens computed: a resident chunk is left for later rounds.
        (req,) = add(sched, 12)
        run_round(sched, ALLOW_ALL)
        assert req.num_uncomputed_prompt_tokens == 4
    fill_pool(sched, used_pages - sched.pool.num_used_pages)
    assert sched.pool.occupancy == used_pages / 100
    if new_prompt:
        add(sched, 4, loading=loading)
    assert sched.probe().wants_prefill is wants


@pytest.mark.parametrize(
    ("setup", "probe"),
    [
        pytest.param("empty", Probe(False, False), id="idle"),
        pytest.param("waiting", Probe(True, False), id="new-prompt-only"),
        pytest.param("decoding", Probe(False, True), id="decoding-only"),
        pytest.param("decoding+waiting", Probe(True, True), id="decoding-and-new-prompt"),
        pytest.param("first-decode", Probe(False, True), id="prefill-done-first-decode-next"),
    ],
)
def test_probe_has_decode_work(setup: str, probe: Probe) -> None:
    sched = make_scheduler()
    if setup.startswith("decoding"):
        decoding(sched, 4)
    if setup.endswith("waiting"):
        add(sched, 4)
    if setup == "first-decode":
        add(sched, 4)
        sched.plan(ALLOW_ALL)  # the whole prompt is computed by this plan
    assert sched.probe() == probe


def test_probe_after_the_plan_reports_only_leftover_prefill() -> None:
    sched = make_scheduler(max_scheduled_tokens=8)
    add(sched, 8)
    sched.plan(ALLOW_ALL)
    assert sched.probe() == Probe(wants_prefill=False, has_decode_work=True)


# --- the plan: admission, full batch, chunking ----------------------------------------------------


def test_new_prompt_is_admitted_and_prefilled_in_one_chunk() -> None:
    sched = make_scheduler()
    (req,) = add(sched, 10)
    plan = run_round(sched, ALLOW_ALL)
    assert chunk_summary(plan) == [(req.request_id, 10, True)]
    assert plan.kind is RoundKind.PREFILL and plan.num_extends == 1 and plan.num_tokens == 10
    assert req.status is RequestStatus.DECODING and req.output_token_ids == [0]
    assert len(req.page_ids) == 3 and req.first_prefill_round == 1


@pytest.mark.parametrize(
    ("max_num_seqs", "dp_size", "num_prompts", "admitted"),
    [
        (8, 1, 3, 3),
        (2, 1, 3, 2),  # the third prompt finds the batch full
        (8, 4, 3, 2),  # max_batch_size = 8 // 4 = 2
        (9, 4, 3, 2),  # 9 // 4 = 2
        (4, 4, 3, 1),
    ],
)
def test_full_batch_defers_new_prefill(
    max_num_seqs: int, dp_size: int, num_prompts: int, admitted: int
) -> None:
    sched = make_scheduler(make_args(dp_size, "none", max_num_seqs=max_num_seqs))
    assert sched.max_batch_size == max_num_seqs // dp_size
    add(sched, *[4] * num_prompts)
    plan = run_round(sched, ALLOW_ALL)
    assert plan.num_extends == admitted
    assert len(sched.running) == admitted and len(sched.waiting) == num_prompts - admitted
    # With the batch still full the prompt keeps waiting, gate or not.
    plan = run_round(sched, ALLOW_ALL)
    assert plan.num_extends == 0 and len(sched.waiting) == num_prompts - admitted


@pytest.mark.parametrize(
    ("prompt_len", "budget", "chunks"),
    [
        (20, 8, [8, 8, 4]),
        (16, 8, [8, 8]),
        (5, 8, [5]),
        (9, 3, [3, 3, 3]),
        (1, 1, [1]),
    ],
)
def test_chunked_prefill_over_several_rounds(
    prompt_len: int, budget: int, chunks: list[int]
) -> None:
    sched = make_scheduler(max_scheduled_tokens=budget)
    (req,) = add(sched, prompt_len)
    for i, size in enumerate(chunks):
        plan = sched.plan(ALLOW_ALL)
        (chunk,) = plan.chunks
        assert (chunk.start, chunk.num_tokens, chunk.is_prefill) == (sum(chunks[:i]), size, True)
        last = i == len(chunks) - 1
        assert chunk.samples is last  # only the chunk that ends the prompt samples
        sched.update(plan, sampled(plan))
        assert req.status is (RequestStatus.DECODING if last else RequestStatus.PREFILLING)
        assert sched.probe().wants_prefill is not last
        assert plan.num_tokens <= budget
    assert req.output_token_ids == [0]
    assert run_round(sched, ALLOW_ALL).kind is RoundKind.DECODE


def test_budget_is_shared_by_several_prompts_fifo() -> None:
    sched = make_scheduler(max_scheduled_tokens=10)
    a, b, c = add(sched, 4, 4, 4)
    plan = run_round(sched, ALLOW_ALL)
    assert chunk_summary(plan) == [
        (a.request_id, 4, True),
        (b.request_id, 4, True),
        (c.request_id, 2, True),
    ]
    plan = sched.plan(ALLOW_ALL)
    # Non-mixed: the resident chunk runs alone; a and b wait one round to decode.
    assert chunk_summary(plan) == [(c.request_id, 2, True)]


def test_loading_prompt_waits_until_marked_loaded() -> None:
    sched = make_scheduler()
    (req,) = add(sched, 4, loading=True)
    assert req.status is RequestStatus.LOADING
    assert sched.probe().wants_prefill  # counts as new work
    plan = run_round(sched, ALLOW_ALL)
    assert plan.kind is RoundKind.IDLE and req.status is RequestStatus.LOADING
    sched.mark_loaded(req.request_id)
    assert run_round(sched, ALLOW_ALL).num_extends == 1


def test_watermark_blocks_new_prompts_inside_the_plan_too() -> None:
    # A resident chunk opens the rank's vote above the watermark, but the plan still admits no
    # new prompt while the pool is over 0.9 full.
    sched = make_scheduler(page_size=1, num_kv_pages=100, max_scheduled_tokens=8)
    (resident,) = add(sched, 12)
    run_round(sched, ALLOW_ALL)
    fill_pool(sched, 92 - sched.pool.num_used_pages)
    (new,) = add(sched, 2)
    plan = run_round(sched, ALLOW_ALL)
    assert chunk_summary(plan) == [(resident.request_id, 4, True)]
    assert new.status is RequestStatus.WAITING


# --- the gate's permission ------------------------------------------------------------------------


def test_gate_closed_holds_new_prompts_and_resident_chunks() -> None:
    sched = make_scheduler(max_scheduled_tokens=8)
    resident, new = add(sched, 12, 4)
    run_round(sched, ALLOW_ALL)
    assert resident.num_computed_tokens == 8 and new.status is RequestStatus.WAITING
    pages_before = list(resident.page_ids)
    for _ in range(3):
        plan = run_round(sched, HOLD_ALL)
        assert plan.kind is RoundKind.IDLE and plan.permission == HOLD_ALL
        assert resident.num_computed_tokens == 8 and resident.page_ids == pages_before
        assert new.status is RequestStatus.WAITING
        assert sched.probe().wants_prefill
    plan = run_round(sched, ALLOW_ALL)
    assert chunk_summary(plan) == [(resident.request_id, 4, True), (new.request_id, 4, True)]


@pytest.mark.parametrize(
    ("permission", "planned"),
    [
        (ALLOW_ALL, ["resident", "new"]),
        (HOLD_ALL, []),
        # SGLang's DELAY: finish the chunk in progress, admit nothing new.
        (CHUNKS_ONLY, ["resident"]),
        (NEW_ONLY, ["new"]),
    ],
)
def test_each_permission_bit_gates_its_own_prefill(
    permission: Permission, planned: list[str]
) -> None:
    sched = make_scheduler(max_scheduled_tokens=8)
    resident, new = add(sched, 12, 4)
    run_round(sched, ALLOW_ALL)  # 8 of resident's 12 tokens: a resident chunk is left
    names = {resident.request_id: "resident", new.request_id: "new"}
    plan = run_round(sched, permission)
    assert plan.permission == permission
    assert [(names[rid], n, pre) for rid, n, pre in chunk_summary(plan)] == [
        (name, 4, True) for name in planned
    ]
    assert (resident.num_computed_tokens == 12) is ("resident" in planned)
    assert (new.status is RequestStatus.WAITING) is ("new" not in planned)


def test_gate_closed_still_runs_decodes() -> None:
    sched = make_scheduler()
    (dec,) = decoding(sched, 4)
    add(sched, 4)
    plan = run_round(sched, HOLD_ALL)
    assert chunk_summary(plan) == [(dec.request_id, 1, False)]
    assert plan.kind is RoundKind.DECODE


# --- mixed vs non-mixed ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mixed", "permission", "kind", "decodes", "prefill_tokens"),
    [
        # Non-mixed: a round with prefill runs it alone; decodes wait for a round without.
        (False, ALLOW_ALL, RoundKind.PREFILL, 0, 6),
        (False, HOLD_ALL, RoundKind.DECODE, 3, 0),
        # Mixed: decodes first, then prefill in the leftover budget.
        (True, ALLOW_ALL, RoundKind.MIXED, 3, 6),
        (True, HOLD_ALL, RoundKind.DECODE, 3, 0),
    ],
)
def test_mixed_and_non_mixed_batches(
    mixed: bool, permission: Permission, kind: RoundKind, decodes: int, prefill_tokens: int
) -> None:
    sched = make_scheduler(enable_mixed_prefill_decode=mixed, max_scheduled_tokens=16)
    decoding(sched, 4, 4, 4)
    add(sched, 6)
    plan = run_round(sched, permission)
    assert plan.kind is kind
    assert (plan.num_decodes, plan.num_prefill_tokens) == (decodes, prefill_tokens)
    if kind is RoundKind.MIXED:
        flags = [c.is_prefill for c in plan.chunks]
        assert flags == sorted(flags), "decodes come before prefill chunks"


@pytest.mark.parametrize(
    ("permission", "decodes", "prefill_tokens"),
    [
        # Gate open: the decode batch leaves min(pending prefill, budget // 2) = 4 tokens.
        (ALLOW_ALL, 4, 4),
        # Gate closed: no prefill can ride along, so no reserve: all 8 decodes fit the budget.
        (HOLD_ALL, 8, 0),
        # Chunks only, and no resident chunk: nothing may ride along either.
        (CHUNKS_ONLY, 8, 0),
    ],
)
def test_mixed_prefill_reserve_only_while_the_gate_is_open(
    permission: Permission, decodes: int, prefill_tokens: int
) -> None:
    sched = make_scheduler(
        enable_mixed_prefill_decode=True, max_scheduled_tokens=8, max_num_seqs=16
    )
    decoding(sched, *[1] * 8)
    add(sched, 6)
    plan = run_round(sched, permission)
    assert (plan.num_decodes, plan.num_prefill_tokens) == (decodes, prefill_tokens)
    assert plan.num_tokens <= 8


def test_mixed_prefill_takes_whatever_budget_decodes_leave() -> None:
    sched = make_scheduler(enable_mixed_prefill_decode=True, max_scheduled_tokens=16)
    decoding(sched, 1, 1)
    (new,) = add(sched, 40)
    plan = run_round(sched, ALLOW_ALL)
    assert plan.num_decodes == 2 and chunk_summary(plan)[-1] == (new.request_id, 14, True)


# --- retraction and readmission -------------------------------------------------------------------


def pressured_trio(b_max_tokens: int = 2) -> tuple[Scheduler, Request, Request, Request]:
    """Three decoding requests a (4 prompt tokens), b, c (3 each) filling a 3-page pool.

    After their first sample a holds 5 tokens and needs a second page to decode; b and c hold
    4 tokens and still fit their page. By default b finishes with its next token.
    """
    sched = make_scheduler(page_size=4, num_kv_pages=3)
    a, b, c = decoding(sched, (4, 16), (3, b_max_tokens), (3, 16))
    assert sched.pool.num_free_pages == 0
    return sched, a, b, c


def test_retraction_under_kv_pressure_picks_the_newest() -> None:
    sched, a, b, c = pressured_trio()
    old_pages = list(c.page_ids)
    plan = sched.plan(HOLD_ALL)
    assert [(r.request_id, pages) for r, pages in plan.retracted] == [(c.request_id, old_pages)]
    assert c.status is RequestStatus.RETRACTED and c.page_ids == []
    assert sched.running == [a, b] and list(sched.retracted) == [c]
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
    assert c.status is RequestStatus.DECODING and c in sched.running
    # Restored with its cached tokens, then decoded as usual in the same round.
    assert chunk_summary(plan) == [(a.request_id, 1, False), (c.request_id, 1, False)]
    assert c.num_computed_tokens == computed + 1


def test_readmission_waits_for_room_then_restores_fifo() -> None:
    sched, a, b, c = pressured_trio(b_max_tokens=16)  # b keeps decoding
    run_round(sched, HOLD_ALL)  # c retracted so that a gets its second page
    plan = run_round(sched, HOLD_ALL)
    # No free page for c. b now needs a second page too and, being the newest, retracts itself.
    assert plan.readmitted == [] and [r for r, _ in plan.retracted] == [b]
    assert list(sched.retracted) == [c, b]
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
    p, d = sched.running
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


# --- abort, update, intake ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "status"),
    [
        ("waiting", RequestStatus.WAITING),
        ("loading", RequestStatus.LOADING),
        ("resident", RequestStatus.PREFILLING),
        ("running", RequestStatus.DECODING),
        ("retracted", RequestStatus.RETRACTED),
    ],
)
def test_abort_frees_pages_and_reports_a_finish(where: str, status: RequestStatus) -> None:
    if where in ("running", "retracted"):
        sched, _, b, c = pressured_trio()
        victim = b
        if where == "retracted":
            run_round(sched, HOLD_ALL)  # c is retracted under a's decode pressure
            victim = c
    else:
        sched = make_scheduler(max_scheduled_tokens=4)
        (victim,) = add(sched, 8, loading=where == "loading")
        if where == "resident":
            run_round(sched, ALLOW_ALL)  # 4 of 8 prompt tokens: a resident chunk
    assert victim.status is status
    sched.abort(victim.request_id)
    assert sched.has_unfinished
    plan = sched.plan(HOLD_ALL)
    assert victim.status is RequestStatus.FINISHED_ABORTED and victim.finish_reason == "abort"
    assert sched.pool.pages_of(victim.request_id) == [] and victim.page_ids == []
    assert victim not in sched.running and victim not in sched.waiting
    assert victim not in sched.retracted and victim.request_id not in sched.requests
    assert all(c.request is not victim for c in plan.chunks)
    events = sched.update(plan, sampled(plan))
    assert [(e.request, e.token_id, e.finished) for e in events if e.request is victim] == [
        (victim, None, True)
    ]
    sched.pool.check_integrity()
    assert sched.num_aborts == 1


def test_load_completing_after_an_abort_is_ignored() -> None:
    sched = make_scheduler()
    (req,) = add(sched, 4, loading=True)
    sched.abort(req.request_id)
    run_round(sched, ALLOW_ALL)  # the abort is applied and the request forgotten
    sched.mark_loaded(req.request_id)  # the storage read finishes late
    assert req.status is RequestStatus.FINISHED_ABORTED and not sched.has_unfinished


def test_abort_of_unknown_or_finished_request_is_ignored() -> None:
    sched = make_scheduler()
    (req,) = add(sched, (4, 1))
    run_round(sched, ALLOW_ALL)
    assert req.status is RequestStatus.FINISHED_LENGTH
    sched.abort(req.request_id)
    sched.abort("no-such-request")
    plan = sched.plan(ALLOW_ALL)
    assert sched.num_aborts == 0 and sched.update(plan, sampled(plan)) == []
    assert req.status is RequestStatus.FINISHED_LENGTH


def test_update_appends_tokens_and_frees_finished_requests() -> None:
    sched = make_scheduler()
    short, long = add(sched, (4, 2), (6, 5))
    plan = sched.plan(ALLOW_ALL)
    events = sched.update(plan, RoundResult({short.request_id: 11, long.request_id: 12}))
    assert [(e.request.request_id, e.token_id, e.finished) for e in events] == [
        (short.request_id, 11, False),
        (long.request_id, 12, False),
    ]
    plan = sched.plan(ALLOW_ALL)
    events = sched.update(plan, RoundResult({short.request_id: 21, long.request_id: 22}))
    assert [(e.request.request_id, e.token_id, e.finished) for e in events] == [
        (short.request_id, 21, True),
        (long.request_id, 22, False),
    ]
    assert short.output_token_ids == [11, 21] and long.output_token_ids == [12, 22]
    assert short.status is RequestStatus.FINISHED_LENGTH and short not in sched.running
    assert sched.pool.pages_of(short.request_id) == [] and short.request_id not in sched.requests
    assert sched.pool.num_used_pages == len(long.page_ids) == 2
    sched.pool.check_integrity()


def test_stop_token_finishes_through_update() -> None:
    sched = make_scheduler()
    req = Request("s", [7] * 4, SamplingParams(max_tokens=50, stop_token_ids=(42,)))
    sched.add_request(req)
    run_round(sched, ALLOW_ALL, token=1)
    run_round(sched, ALLOW_ALL, token=42)
    assert req.status is RequestStatus.FINISHED_STOPPED and req.output_token_ids == [1, 42]
    assert sched.pool.num_used_pages == 0


def test_update_skips_chunks_that_do_not_sample() -> None:
    sched = make_scheduler(max_scheduled_tokens=4)
    (req,) = add(sched, 10)
    plan = sched.plan(ALLOW_ALL)
    assert sched.update(plan, RoundResult({})) == []  # mid-prompt chunk: nothing sampled
    assert req.output_token_ids == []


@pytest.mark.parametrize(
    ("overrides", "prompt_len", "message"),
    [
        ({"max_model_len": 8}, 8, "context length 8"),  # prompt + 1 token must fit
        ({"max_model_len": 8}, 20, "context length 8"),
        ({"num_kv_pages": 2, "page_size": 4}, 8, "more KV pages"),
        ({"num_kv_pages": 2, "page_size": 4}, 50, "more KV pages"),
    ],
)
def test_add_request_refuses_prompts_that_can_never_run(
    overrides: dict, prompt_len: int, message: str
) -> None:
    sched = make_scheduler(**overrides)
    with pytest.raises(ValueError, match=message):
        sched.add_request(make_request("long", prompt_len))
    assert not sched.has_unfinished and sched.requests == {}


@pytest.mark.parametrize(
    ("overrides", "prompt_len"),
    [({"max_model_len": 8}, 7), ({"num_kv_pages": 2, "page_size": 4}, 7)],
)
def test_add_request_accepts_prompts_at_the_limit(overrides: dict, prompt_len: int) -> None:
    sched = make_scheduler(**overrides)
    sched.add_request(make_request("edge", prompt_len))
    assert sched.has_unfinished


def test_add_request_refuses_duplicate_ids() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("same"))
    with pytest.raises(ValueError, match="duplicate request id"):
        sched.add_request(make_request("same"))


# --- admission-wait accounting --------------------------------------------------------------------


def test_admission_wait_counts_from_the_first_published_want() -> None:
    sched = make_scheduler()
    (req,) = add(sched, 4)
    for _ in range(3):  # the gate holds the prompt for three rounds
        sched.plan(HOLD_ALL)
        assert sched.publish_probe().wants_prefill
    assert req.first_want_round == 1
    plan = sched.plan(ALLOW_ALL)
    sched.publish_probe()
    sched.update(plan, sampled(plan))
    assert req.first_prefill_round == 4 and sched.admission_wait(req) == 3


def test_admission_wait_excuses_full_batch_rounds() -> None:
    sched = make_scheduler(max_num_seqs=1)
    (blocker,) = decoding(sched, (4, 3))
    (req,) = add(sched, 4)
    rounds = 0
    while req.first_prefill_round is None:
        plan = sched.plan(ALLOW_ALL)
        sched.publish_probe()
        sched.update(plan, sampled(plan))
        rounds += 1
    assert blocker.is_finished and rounds == 3
    # Want published in round 2; round 3 was held by the full batch (not the gate's doing);
    # admitted in round 4, the first round with a free slot.
    assert (req.first_want_round, req.first_prefill_round) == (2, 4)
    assert req.excused_wait_rounds == 1 and sched.admission_wait(req) == 1
