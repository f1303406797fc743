"""A steady rank's decode rounds, k at once: the scheduler's horizon for the simulator's fast path.

A rank whose running requests all decode, with nothing retracted, resident or ending, runs
rounds whose outcome is known ahead: one token per request and a page whenever one fills.
When the driver also knows the token every decode samples (the simulator's), k such rounds
can be applied in one step. ``SteadyDecodes`` does the requests' and the pool's share of that
step; ``Scheduler.skip_decode_rounds`` wraps it with the rounds' own bookkeeping (the round
counter, the admission waits, the finishes), so nothing outside the scheduler writes those.

Pool operations happen in the order the full rounds make them: a request that needs its next
page first keys the page it filled (with prefix caching) and then takes one, round by round
and in running order, so page ids, keys and evictions come out the same
(``tests/test_fast_forward.py`` compares whole simulated runs with the full rounds).
"""

from __future__ import annotations

from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.planner import PREFILL_WATERMARK
from roundgate.actors.control.prefix_cache import PrefixCache
from roundgate.actors.control.queues import RequestQueues
from roundgate.actors.control.request import Request

# ``horizon``'s answer for "not within any run": no request is that far from its end.
FAR_ROUNDS = 1 << 30

# A page grant of k steady rounds: (round, running order, request).
Grant = tuple[int, int, Request]


class SteadyDecodes:
    """The requests' and the pool's share of k steady decode rounds; one per ``Scheduler``."""

    def __init__(
        self, queues: RequestQueues, pool: KVPool, prefix: PrefixCache, max_sequence_len: int
    ) -> None:
        self.queues = queues
        self.pool = pool
        self.prefix = prefix
        self.max_sequence_len = max_sequence_len

    def horizon(self) -> tuple[int, int]:
        """Steady decode rounds until the first request finishes at its length (the finishing
        round counted), and until the first page grant; ``FAR_ROUNDS`` for never."""
        room = self.max_sequence_len
        page_size = self.pool.page_size
        first_end = first_grant = FAR_ROUNDS
        for req in self.queues.running:
            prompt = req.num_prompt_tokens
            out = len(req.output_token_ids)
            left = req.sampling.max_tokens - out - req.num_resumed_tokens
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

    def page_grants(self, k: int) -> list[Grant] | None:
        """The page grants of k rounds in the order the plans would make them; None when the
        pool cannot grant them all, or when they would carry it across the watermark while a
        prompt waits (its probe would flip)."""
        pool = self.pool
        page_size = pool.page_size
        grants: list[Grant] = []
        for order, req in enumerate(self.queues.running):
            j = len(req.page_ids) * page_size - req.num_computed_tokens
            while j < k:
                grants.append((j, order, req))
                j += page_size
        if not grants:
            return grants
        if len(grants) > pool.num_free_pages:
            return None
        if self.queues.waiting:
            before = pool.occupancy > PREFILL_WATERMARK
            after = (pool.num_used_pages + len(grants)) / pool.num_pages > PREFILL_WATERMARK
            if before != after:
                return None
        if len(grants) > 1:
            grants.sort(key=lambda g: (g[0], g[1]))
        return grants

    def decode(self, k: int, grants: list[Grant], token: int, finishing: bool) -> None:
        """The k rounds' decodes: each running request gets k computed tokens and k tokens
        ``token`` (k - 1 when the last round ``finishing`` appends its own, as ``update``
        does), and the pool makes ``grants``."""
        tokens = [token] * (k - 1 if finishing else k)
        for req in self.queues.running:
            req.output_token_ids.extend(tokens)
            req.num_computed_tokens += k
        if not grants:
            return
        # As round j plans it (its computed tokens end on a page edge): key the page just
        # filled, then take the next one.
        keep = self.prefix.enabled
        keep_last_page = self.prefix.keep_last_page
        grow = self.pool.grow
        for j, _, req in grants:
            end = req.num_computed_tokens
            tokens_then = end - k + j  # computed when round j plans
            if keep:
                req.num_computed_tokens = tokens_then  # what ``keep_last_page`` reads then
                keep_last_page(req)
                req.num_computed_tokens = end
            grow(req.request_id, tokens_then + 1)
