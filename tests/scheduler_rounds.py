"""Scheduler test builders: queue requests, run one round, fill the pool, a pressured trio."""

from __future__ import annotations

import itertools

from builders import make_request, make_scheduler

from roundgate.actors.control.request import Request, RequestStatus
from roundgate.actors.control.round import RoundPlan, RoundResult
from roundgate.actors.control.scheduler import Scheduler
from roundgate.gate.permission import ALLOW_ALL, Permission

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


def pressured_trio(b_max_tokens: int = 2) -> tuple[Scheduler, Request, Request, Request]:
    """Three decoding requests a (4 prompt tokens), b, c (3 each) filling a 3-page pool.

    After their first sample a holds 5 tokens and needs a second page to decode; b and c hold
    4 tokens and still fit their page. By default b finishes with its next token.
    """
    sched = make_scheduler(page_size=4, num_kv_pages=3)
    a, b, c = decoding(sched, (4, 16), (3, b_max_tokens), (3, 16))
    assert sched.pool.num_free_pages == 0
    return sched, a, b, c
