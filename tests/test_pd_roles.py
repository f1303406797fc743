"""The P/D roles of the control plane, without a model: a prefill rank hands requests off and
keeps their pages pinned until released; a decode rank reserves pages for a handoff only under
the watermark and when they fit, holds them while the transfer runs (an abort included), and
fails a request whose transfer failed alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import make_args, make_request

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.handoff import Handoff
from roundgate.actors.control.request import RequestStatus, SamplingParams
from roundgate.sim.cost_executor import SIM_TOKEN, CostExecutor
from roundgate.sim.round_costs import TOY

FIRST = 5  # a handoff's first token (the cost executor samples SIM_TOKEN after it)


def make_core(role: str, num_kv_pages: int = 32, **overrides: object) -> EngineCore:
    args = make_args(
        dp_size=1, policy="none", disaggregation_mode=role, num_kv_pages=num_kv_pages, **overrides
    )
    return EngineCore(args, CostExecutor(TOY))


def make_handoff(request_id: str, prompt_len: int, max_tokens: int = 4) -> Handoff:
    """A handoff as a prefill rank with 4-token pages would send it (its pages 0, 1, ...)."""
    return Handoff(
        request_id=request_id,
        prompt_token_ids=(3,) * prompt_len,
        sampling=SamplingParams(max_tokens=max_tokens),
        first_token_ids=(FIRST,),
        first_logprobs=(None,),
        prompt_logprobs=(),
        page_ids=tuple(range(-(-prompt_len // 4))),
        num_kv_tokens=prompt_len,
    )


def fork_handoff(prompt_len: int, n: int) -> Handoff:
    """A handoff of ``n`` sequences (each with the same first token)."""
    one = make_handoff("h", prompt_len)
    return replace(
        one,
        sampling=replace(one.sampling, n=n),
        first_token_ids=(FIRST,) * n,
        first_logprobs=(None,) * n,
    )


def test_a_prefill_rank_hands_off_at_the_first_token_and_pins_pages_until_released() -> None:
    core = make_core("prefill")
    core.submit(make_request("a", prompt_len=10, max_tokens=4))
    core.submit(make_request("done", prompt_len=3, max_tokens=1))  # ends at its first token
    outcome = core.step()
    assert [h.request_id for h in outcome.handoffs] == ["a"]
    handoff = outcome.handoffs[0]
    assert handoff.first_token_ids == (SIM_TOKEN,) and len(handoff.page_ids) == 3
    # The one-token request finished here, with its token; the handed-off one sent nothing.
    assert [(e.request.request_id, e.token_id, e.finished) for e in outcome.events] == [
        ("done", SIM_TOKEN, True)
    ]
    pool = core.scheduler.pool
    assert pool.num_used_pages == 3 and not core.scheduler.queues.requests
    with pytest.raises(ValueError, match="already in use"):
        core.submit(make_request("a"))
    assert not core.step().plan.chunks  # it never decodes here
    core.release_handoff("a")
    core.step()
    assert pool.num_used_pages == 0
    pool.check_integrity()


def test_pinned_pages_hold_a_prefill_rank_at_the_watermark() -> None:
    core = make_core("prefill", num_kv_pages=10)
    core.submit(make_request("big", prompt_len=37))  # all 10 pages, in three 16-token rounds
    assert [len(core.step().handoffs) for _ in range(3)] == [0, 0, 1]
    core.submit(make_request("next", prompt_len=3))
    for _ in range(3):
        assert not core.step().plan.chunks  # held: the pool is full of pinned pages
    core.release_handoff("big")
    assert [h.request_id for h in core.step().handoffs] == ["next"]


def test_a_decode_rank_reserves_only_under_the_watermark_and_when_the_pages_fit() -> None:
    core = make_core("decode", num_kv_pages=20)
    core.submit_handoff(make_handoff("a", 75, max_tokens=3))  # 19 of 20 pages: over 0.9
    core.submit_handoff(make_handoff("b", 2, max_tokens=2))  # needs 1 page: it would fit
    (reservation,) = core.step().plan.reservations
    assert reservation.request_id == "a" and reservation.target_page_ids == tuple(range(19))
    assert reservation.page_indices == tuple(range(19))
    assert core.scheduler.queues.requests["a"].status is RequestStatus.WAITING_FOR_REMOTE_KV
    assert not core.waits_on_transfers  # "b" still waits for a reservation
    assert not core.step().plan.reservations  # "b" waits: the pool is over the watermark
    core.kv_arrived("a")
    outcome = core.step()
    # Its first token goes out in the round its KV arrived, which also decodes its second.
    assert [(e.request.request_id, e.token_id) for e in outcome.events] == [
        ("a", FIRST),
        ("a", SIM_TOKEN),
    ]
    assert [(c.request.request_id, c.num_tokens, c.is_prefill) for c in outcome.plan.chunks] == [
        ("a", 1, False)
    ]
    assert not outcome.plan.reservations
    while "a" in core.scheduler.queues.requests:
        assert not core.step().plan.reservations
    assert [r.request_id for r in core.step().plan.reservations] == ["b"]
    core.scheduler.pool.check_integrity()


def test_a_handoff_that_does_not_fit_waits_and_is_never_transferred_into_a_full_pool() -> None:
    core = make_core("decode", num_kv_pages=20)
    core.submit_handoff(make_handoff("a", 63, max_tokens=3))  # 16 pages: 0.8
    core.submit_handoff(make_handoff("b", 19, max_tokens=2))  # 5 pages: only 4 are free
    assert [r.request_id for r in core.step().plan.reservations] == ["a"]
    core.kv_arrived("a")
    reserved = []
    for _ in range(6):
        reserved += core.step().plan.reservations
        assert core.scheduler.pool.num_used_pages <= 20
    assert [r.request_id for r in reserved] == ["b"]  # once "a" finished and freed its pages


def test_an_abort_in_flight_keeps_the_pages_until_the_transfer_ends() -> None:
    core = make_core("decode")
    core.submit_handoff(make_handoff("a", 9))
    core.submit_handoff(make_handoff("b", 9))
    assert len(core.step().plan.reservations) == 2
    assert core.waits_on_transfers  # nothing to plan until a transfer ends
    pool = core.scheduler.pool
    core.abort("a")
    events = core.step().events
    assert [(e.request.request_id, e.finished) for e in events] == [("a", True)]
    assert pool.num_used_pages == 6  # "a"'s three pages are still being written
    core.kv_arrived("a")
    core.kv_failed("b", "KV transfer of request b timed out")
    events = core.step().events
    assert [(e.request.request_id, e.request.error) for e in events] == [
        ("b", "KV transfer of request b timed out")
    ]
    assert pool.num_used_pages == 0 and not core.has_local_work
    pool.check_integrity()


@pytest.mark.parametrize(
    ("role", "call", "culprit"),
    [
        ("decode", lambda c: c.submit(make_request("p")), "takes handoffs only"),
        ("null", lambda c: c.submit_handoff(make_handoff("h", 4)), "only a decode rank"),
        ("decode", lambda c: c.submit_handoff(make_handoff("h", 200)), "more KV pages"),
        ("decode", lambda c: c.submit_handoff(fork_handoff(120, n=8)), "needs 38 KV pages"),
        # A transfer's end is taken only by the role whose transfers end that way (once, one
        # queue of ``(id, None)`` turned a release sent to a decode rank into an arrival).
        ("decode", lambda c: c.release_handoff("h"), "only a prefill rank"),
        ("prefill", lambda c: c.kv_arrived("h"), "only a decode rank"),
        ("null", lambda c: c.kv_failed("h", "timed out"), "only a decode rank"),
    ],
)
def test_a_rank_refuses_work_its_role_cannot_take(role: str, call, culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        call(make_core(role))


def test_forks_share_the_prompt_pages_and_copy_only_the_partial_last_one() -> None:
    core = make_core("decode")
    core.submit_handoff(fork_handoff(10, n=3))  # pages 0-1 full, page 2 holds 2 tokens
    (reservation,) = core.step().plan.reservations
    pool = core.scheduler.pool
    parent = reservation.target_page_ids
    assert len(parent) == 3 and pool.num_used_pages == 3 + 2  # one private page per fork
    assert [pool.num_holders(p) for p in parent] == [3, 3, 1]
    core.kv_arrived("h")
    outcome = core.step()
    forks = [core.scheduler.queues.requests[f"h#{j}"] for j in (1, 2)]
    assert outcome.plan.page_copies == [(parent[2], f.page_ids[2]) for f in forks]
    assert [f.page_ids[:2] for f in forks] == [list(parent[:2])] * 2
    assert sorted(e.request.request_id for e in outcome.events if e.token_id == FIRST) == [
        "h",
        "h#1",
        "h#2",
    ]
    pool.check_integrity()


@pytest.mark.parametrize("ended", [(0,), (0, 1), (1,)], ids=["parent", "parent+fork", "fork"])
def test_sequences_that_end_at_their_first_token_leave_the_forks_copies_intact(ended) -> None:
    # A stop token sampled on the prefill rank ends a sequence at arrival. Sequence 0's last
    # page is the forks' copy source: it stays held until the copies ran; a fork that ended
    # gets no copy (its pages are freed). Served, sequence 0 ending first crashed the rank.
    one = fork_handoff(10, n=3)
    firsts = tuple(2 if j in ended else FIRST for j in range(3))
    handoff = replace(
        one,
        sampling=replace(one.sampling, stop_token_ids=(2,)),
        first_token_ids=firsts,
    )
    core = make_core("decode")
    core.submit_handoff(handoff)
    (reservation,) = core.step().plan.reservations
    parent_tail = reservation.target_page_ids[2]
    pool = core.scheduler.pool
    core.kv_arrived("h")
    outcome = core.step()
    live = [j for j in (1, 2) if j not in ended]
    targets = [core.scheduler.queues.requests[f"h#{j}"].page_ids[2] for j in live]
    assert outcome.plan.page_copies == [(parent_tail, t) for t in targets]
    assert pool.num_holders(parent_tail) == (1 if live and 0 in ended else int(0 not in ended))
    pool.check_integrity()
    for _ in range(8):  # the rest decode to their end; every page comes back
        core.step()
    assert pool.num_used_pages == 0
    pool.check_integrity()
