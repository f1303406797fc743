"""Scheduler bookkeeping: aborts, update, request intake and admission-wait accounting."""

from __future__ import annotations

import pytest
from builders import make_request, make_scheduler
from scheduler_rounds import add, decoding, pressured_trio, run_round, sampled

from roundgate.actors.control.request import Request, RequestStatus, SamplingParams
from roundgate.actors.control.round import RoundResult
from roundgate.gate.permission import ALLOW_ALL, HOLD_ALL

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
    assert victim not in sched.queues.running and victim not in sched.queues.waiting
    assert victim not in sched.queues.retracted and victim.request_id not in sched.queues.requests
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
    assert short.status is RequestStatus.FINISHED_LENGTH and short not in sched.queues.running
    assert (
        sched.pool.pages_of(short.request_id) == []
        and short.request_id not in sched.queues.requests
    )
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
def test_check_fits_refuses_prompts_that_can_never_run(
    overrides: dict, prompt_len: int, message: str
) -> None:
    sched = make_scheduler(**overrides)
    with pytest.raises(ValueError, match=message):
        sched.check_fits(make_request("long", prompt_len))
    assert not sched.has_unfinished and sched.queues.requests == {}


@pytest.mark.parametrize(
    ("overrides", "prompt_len"),
    [({"max_model_len": 8}, 7), ({"num_kv_pages": 2, "page_size": 4}, 7)],
)
def test_check_fits_accepts_prompts_at_the_limit(overrides: dict, prompt_len: int) -> None:
    sched = make_scheduler(**overrides)
    edge = make_request("edge", prompt_len)
    sched.check_fits(edge)
    sched.add_request(edge)
    assert sched.has_unfinished


def test_add_request_does_not_check_the_limits_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limits are checked once, at the rank's intake (``EngineCore.submit``)."""
    sched = make_scheduler(max_model_len=8)

    def counted(request: Request) -> None:
        raise AssertionError("add_request checked the limits again")

    monkeypatch.setattr(sched, "check_fits", counted)
    sched.add_request(make_request("queued", 4))
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
