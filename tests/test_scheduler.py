"""Scheduler scenario tables: the probe's watermark rule, the plan under the gate's permission,
chunking, mixed vs non-mixed batches."""

from __future__ import annotations

import pytest
from builders import make_args, make_scheduler
from scheduler_rounds import add, chunk_summary, decoding, fill_pool, run_round, sampled

from roundgate.actors.control.request import RequestStatus
from roundgate.actors.control.round import RoundKind
from roundgate.actors.control.scheduler import Probe
from roundgate.gate.permission import ALLOW_ALL, CHUNKS_ONLY, HOLD_ALL, NEW_ONLY, Permission

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
    assert (
        len(sched.queues.running) == admitted
        and len(sched.queues.waiting) == num_prompts - admitted
    )
    # With the batch still full the prompt keeps waiting, gate or not.
    plan = run_round(sched, ALLOW_ALL)
    assert plan.num_extends == 0 and len(sched.queues.waiting) == num_prompts - admitted


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
