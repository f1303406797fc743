"""A steady rank's decode-only rounds, without plan objects: the simulator's fast path per rank.

A rank whose running requests all decode, with nothing retracted, resident or ending, runs
rounds whose outcome is known without building a plan: one token per request and a page
whenever one fills. These functions make exactly the state changes ``Scheduler.plan`` and
``Scheduler.update`` would, in the same order (the same page ids, keys and evictions), for one
such round (``plan_decode_round`` and ``update_decode_round``, for ``roundgate.sim.decode_ranks``)
or for k of them (``decode_horizon``, ``decode_page_grants`` and ``skip_decode_rounds``, for
``roundgate.sim.fast_forward``). They work through the parts the engine's own rounds use: the pool's
``grow``, the prefix cache's ``keep_last_page``, the admission waits and ``Scheduler.retire``.
``tests/test_steady_rank.py`` runs twin schedulers, one through ``plan``/``update``;
``tests/test_fast_forward.py`` compares whole simulated runs.
"""

from __future__ import annotations

from roundgate.actors.control.planner import PREFILL_WATERMARK
from roundgate.actors.control.request import Request, RequestStatus
from roundgate.actors.control.round import TokenEvent
from roundgate.actors.control.scheduler import Scheduler

_DECODING = RequestStatus.DECODING
_LENGTH = RequestStatus.FINISHED_LENGTH
# ``decode_horizon``'s answer for "not within any run": no request is that far from its end.
FAR_ROUNDS = 1 << 30

# A page grant of k skipped rounds: (round, running order, request).
Grant = tuple[int, int, Request]


def is_steady(s: Scheduler) -> bool:
    """Whether every running request decodes and no resident chunk, retracted request,
    pending abort or final event could change the next plans (prompts may wait)."""
    queues = s.queues
    return not (queues.partial or queues.retracted or s.ends.has_pending)


def plan_decode_round(s: Scheduler) -> list[tuple[Request, int]] | None:
    """``plan`` for a steady rank with nothing waiting (it can only decode, whatever the
    vote): ``(request, start)`` per running request in plan order, pages granted. None (and
    nothing changed) when the rank has other work, the token budget would cut the decodes
    short or a decode would need a retraction: then ``plan`` decides."""
    queues = s.queues
    running = queues.running
    ends = s.ends
    # ``is_steady`` and an empty queue, inlined: asked of every rank every full round.
    if (
        queues.waiting
        or queues.partial
        or queues.retracted
        or ends.pending_aborts
        or ends.events
        or len(running) > s.args.max_scheduled_tokens
    ):
        return None
    pool = s.pool
    page_size = pool.page_size
    new_pages = 0
    for req in running:
        need = req.num_prompt_tokens + len(req.output_token_ids)
        if need > len(req.page_ids) * page_size:
            new_pages += pool.pages_for(need) - len(req.page_ids)
    if new_pages > pool.num_free_pages:
        return None
    s.round += 1  # the plan's round
    prefix = s.prefix
    keep = prefix.enabled
    decodes = []
    for req in running:
        computed = req.num_computed_tokens
        need = req.num_prompt_tokens + len(req.output_token_ids)
        if need > len(req.page_ids) * page_size:
            if keep:
                prefix.keep_last_page(req)
            pool.grow(req.request_id, need)
        decodes.append((req, computed))
        req.num_computed_tokens = computed + 1
    return decodes


def update_decode_round(
    s: Scheduler, decodes: list[tuple[Request, int]], token: int
) -> list[TokenEvent]:
    """``update`` after ``plan_decode_round``'s decodes, each of which sampled ``token``."""
    events = []
    max_len = s.max_sequence_len
    retire = s.retire
    make_event = tuple.__new__
    for req, _ in decodes:
        req.status = _DECODING
        finished = req.append_token(token, max_len)
        if finished:
            retire(req)
        events.append(make_event(TokenEvent, (req, token, finished)))
    return events


def decode_horizon(s: Scheduler) -> tuple[int, int]:
    """For a steady rank: steady decode rounds until its first request finishes at its
    length (the finishing round counted), and until its first page grant; ``FAR_ROUNDS``
    for never."""
    room = s.max_sequence_len
    page_size = s.pool.page_size
    first_end = first_grant = FAR_ROUNDS
    for req in s.queues.running:
        prompt = req.num_prompt_tokens
        out = len(req.output_token_ids)
        left = req.sampling.max_tokens - out
        if room - prompt - out < left:
            left = room - prompt - out
        if left < first_end:
            first_end = left
        # A round's decode needs room for computed + 1 tokens: a new page once the held
        # ones are full of computed tokens (then every page_size rounds).
        grant = len(req.page_ids) * page_size - req.num_computed_tokens
        if grant < first_grant:
            first_grant = grant
    return first_end, first_grant


def decode_page_grants(s: Scheduler, k: int) -> list[Grant] | None:
    """The page grants of k steady decode rounds as ``(round, running order, request)``, in
    the order the plans make them; None when the pool cannot grant them all, or when they
    would carry it across the watermark while a prompt waits (its probe flips)."""
    pool = s.pool
    page_size = pool.page_size
    grants: list[Grant] = []
    for order, req in enumerate(s.queues.running):
        j = len(req.page_ids) * page_size - req.num_computed_tokens
        while j < k:
            grants.append((j, order, req))
            j += page_size
    if not grants:
        return grants
    if len(grants) > pool.num_free_pages:
        return None
    if s.queues.waiting:
        before = pool.occupancy > PREFILL_WATERMARK
        after = (pool.num_used_pages + len(grants)) / pool.num_pages > PREFILL_WATERMARK
        if before != after:
            return None
    if len(grants) > 1:
        grants.sort(key=lambda g: (g[0], g[1]))
    return grants


def skip_decode_rounds(
    s: Scheduler, k: int, grants: list[Grant], token: int, horizon: int
) -> list[Request]:
    """Apply k steady decode rounds at once; returns the requests the last one finished, in
    running order.

    Every running request gets k tokens ``token`` (one that stops none of them), the pool
    takes ``grants`` (``decode_page_grants(s, k)``), the waits count k plans, and the round
    counter moves by k. ``horizon`` is ``decode_horizon(s)[0]``: the caller skips no further
    (k <= horizon), and only at k == horizon does the last round finish requests. It has also
    checked that no vote admits a waiting prompt in those rounds.
    """
    running = s.queues.running
    tokens = [token] * k
    for req in running:
        req.output_token_ids.extend(tokens)
        req.num_computed_tokens += k
    if grants:
        _grant(s, grants, k)
    if s.queues.waiting:
        # Each plan counts an excused round before its probe publishes a want: round 0's
        # count comes before the stamp of a held prompt's first want, the rest after. The
        # grants keep the pool on its side of the watermark, so every round agrees.
        waits = s.waits
        over = s.pool.occupancy > PREFILL_WATERMARK
        excused = s.planner.is_excused
        if excused:
            waits.excused_rounds += 1
        if not over:  # the probe wants prefill for the held prompt
            waits.wanted(s.round + 1)  # round 0 publishes a held prompt's first want
        if excused:
            waits.excused_rounds += k - 1
    s.round += k  # the k plans' rounds
    if k < horizon:
        return []
    max_len = s.max_sequence_len
    done = [
        req
        for req in running
        if len(req.output_token_ids) >= req.sampling.max_tokens
        or req.num_prompt_tokens + len(req.output_token_ids) >= max_len
    ]
    for req in done:
        req.status = _LENGTH
        s.retire(req)
    return done


def _grant(s: Scheduler, grants: list[Grant], k: int) -> None:
    """The skipped plans' pool steps, after the k rounds' tokens are counted: as round j
    plans it (its computed tokens end on a page edge), key the page just filled and take the
    next one."""
    prefix = s.prefix
    keep = prefix.enabled
    grow = s.pool.grow
    for j, _, req in grants:
        end = req.num_computed_tokens
        tokens = end - k + j  # computed when round j plans
        if keep:
            req.num_computed_tokens = tokens  # what ``keep_last_page`` reads, as in round j
            prefix.keep_last_page(req)
            req.num_computed_tokens = end
        grow(req.request_id, tokens + 1)
