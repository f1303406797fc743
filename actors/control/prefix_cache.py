"""Prefix caching on one rank: which prompt pages are reused, which computed pages are kept.

The pool (``KVPool``) does the reference counting and the LRU; this module is the policy on
top: a new prompt starts on the cached pages of its longest page-aligned prefix (unless it
asks for prompt logprobs: cached pages have no logits, so it computes all) and always
computes at least one token (the sample needs the last position's logits), and a page is
keyed only after the forward that wrote it, so no request can reuse K/V not yet computed.

When every page of a prompt is cached (its length is a multiple of the page size), the last
page is not shared but copied into a fresh page, and only the last token is recomputed there:
writing into a shared page would change K/V that other requests read.
"""

from __future__ import annotations

from dataclasses import dataclass

from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.page_keys import extend_keys
from roundgate.actors.control.request import Request, RequestStatus
from roundgate.actors.control.round import RoundPlan

_RETRACTED = RequestStatus.RETRACTED


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """What admission reused: tokens whose K/V need no compute, and a page to copy."""

    num_cached_tokens: int
    copy: tuple[int, int] | None = None  # (cached source page, the request's own page)


NO_HIT = PrefixHit(0)


class PrefixCache:
    """The rank's prefix-cache policy over its pool; counts queries and hits in tokens."""

    def __init__(self, pool: KVPool, enabled: bool) -> None:
        self.pool = pool
        self.enabled = enabled
        # vLLM's prefix_cache_queries / prefix_cache_hits: prompt tokens looked up at
        # admission, and the tokens of those found cached.
        self.num_queries = 0
        self.num_hits = 0

    def prompt_keys(self, req: Request) -> list[bytes]:
        """Keys of the prompt's full pages (computed once, kept on the request)."""
        keys = extend_keys(req.page_keys, req.token_ids, req.num_prompt_tokens, self.pool.page_size)
        return keys[: req.num_prompt_tokens // self.pool.page_size]

    def num_uncached_tokens(self, req: Request) -> int:
        """Prompt tokens a fresh admission of ``req`` would compute (at least one)."""
        if not self.enabled or req.sampling.prompt_logprobs is not None:
            return req.num_prompt_tokens
        cached = self.pool.num_cached_prefix(self.prompt_keys(req)) * self.pool.page_size
        return max(1, req.num_prompt_tokens - cached)

    def admit(self, req: Request) -> PrefixHit | None:
        """Give a new request its pages: the cached prefix (refs taken), plus a fresh copy of
        the last page when the whole prompt is cached. ``None`` when no page is left."""
        pool, owner = self.pool, req.request_id
        # A prompt that wants its logprobs computes every token: cached pages have no logits.
        if not self.enabled or req.sampling.prompt_logprobs is not None:
            return None if pool.allocate(owner, 0) is None else NO_HIT
        keys = self.prompt_keys(req)
        matched = pool.num_cached_prefix(keys)
        page_size = pool.page_size
        if matched * page_size < req.num_prompt_tokens:
            pool.allocate_cached(owner, keys[:matched])
            return PrefixHit(matched * page_size)
        # Every token is cached: share all but the last page, copy that one, redo its last
        # token. Even if taking the copy's page evicts the source, the copy (run before the
        # forward, which is the first writer of any page taken this round) reads intact K/V.
        source = pool.cached_page(keys[matched - 1])
        pool.allocate_cached(owner, keys[: matched - 1])
        if source is None or pool.extend(owner, matched * page_size) is None:
            return PrefixHit((matched - 1) * page_size)
        return PrefixHit(req.num_prompt_tokens - 1, (source, pool.pages_of(owner)[-1]))

    def record(self, req: Request, hit: PrefixHit, plan: RoundPlan) -> None:
        """An admission went through: count it and queue its page copy."""
        if not self.enabled:
            return
        self.num_queries += req.num_prompt_tokens
        self.num_hits += hit.num_cached_tokens
        if hit.copy is not None:
            plan.page_copies.append(hit.copy)

    @staticmethod
    def retarget_copies(old_pages: list[int], plan: RoundPlan) -> None:
        """A request retracted in the round it was admitted: its last page's copy has not run
        yet, so its parked K/V must be read from the copy's source instead (and the copy into
        the page it is giving back is dropped)."""
        kept = []
        for source, target in plan.page_copies:
            if target in old_pages:
                old_pages[old_pages.index(target)] = source
            else:
                kept.append((source, target))
        plan.page_copies[:] = kept

    def keep_prefilled(self, plan: RoundPlan) -> None:
        """After the forward: key every page a prefill chunk of ``plan`` completed, so later
        prompts can reuse it (decoded pages are keyed by ``keep_last_page``)."""
        page_size = self.pool.page_size
        register = self.pool.register
        for req, start, num_tokens, is_prefill in plan.chunks:
            first, last = start // page_size, (start + num_tokens) // page_size
            if not is_prefill or first == last or req.status >= _RETRACTED:
                continue
            keys = extend_keys(req.page_keys, req.token_ids, last * page_size, page_size)
            pages = req.page_ids
            for i in range(first, last):
                register(pages[i], keys[i])

    def keep_decoded_pages(self, req: Request, since: int) -> None:
        """Key every page a verification filled: those whose last token lies in
        ``[since, req.num_computed_tokens)`` (one round may accept tokens across several
        page boundaries, which ``keep_last_page`` would not see)."""
        page_size = self.pool.page_size
        first, last = since // page_size, req.num_computed_tokens // page_size
        if first == last or len(req.page_ids) < last:
            return
        keys = extend_keys(req.page_keys, req.token_ids, last * page_size, page_size)
        for i in range(first, last):
            self.pool.register(req.page_ids[i], keys[i])

    def keep_last_page(self, req: Request) -> None:
        """Key the page a request's decodes just filled, if its computed tokens end on a
        page boundary. Called when it needs its next page, finishes or is aborted: each
        decoded page is keyed once, and the decode loop does nothing on other rounds (the
        next turn of a conversation then reuses the answer too)."""
        page_size = self.pool.page_size
        full, rest = divmod(req.num_computed_tokens, page_size)
        if rest or not full or len(req.page_ids) < full:
            return
        keys = extend_keys(req.page_keys, req.token_ids, full * page_size, page_size)
        self.pool.register(req.page_ids[full - 1], keys[full - 1])
