"""The messages of prefill/decode disaggregation: a request leaving its prefill rank, the
pages a decode rank reserved for it, and the ends of its transfer on either side.

    prefill rank                              transport                      decode rank
    prompt computed, first token sampled
    ──► Handoff (state + its pinned pages) ────────────────────────► submit_handoff(handoff)
                                                                   waits (pool <= 0.9, a slot)
                                     ◄──────── KVReservation ◄──── pages reserved
                                                                   (WAITING_FOR_REMOTE_KV)
    read handoff.page_ids[i] for i in reservation.page_indices
                                     ────────► write reservation.target_page_ids
    HandoffReleased: pages unpinned                                 KVArrived: it decodes
                     (also on a failed transfer)                    KVFailed(why): it fails

The engine core's ``release_handoff``, ``kv_arrived`` and ``kv_failed`` queue the last three
for the rank's next round, where its connector (``roundgate.actors.control.kv_connector``) applies
them.

The handoff carries the request's whole state, not only its KV: the first token of every
sequence (``n > 1`` prefills once; the decode rank forks over shared pages) with its logprobs,
the prompt logprobs, and the sampling parameters. The seed's position needs one field only
for a continuation (``num_resumed_tokens``: a request resumed after its decode rank died): a
seeded sample is drawn at index ``len(output_token_ids) + num_resumed_tokens``, which on the
decode rank goes on just as it would have on a fused rank. A grammar needs none: the decode
rank's executor builds a fresh matcher on first use and feeds it the tokens the request
already has (resumed and first tokens included), the same replay a retracted request never
needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from roundgate.actors.control.request import Request, RequestStatus, SamplingParams, TokenLogprobs


@dataclass(frozen=True, slots=True, kw_only=True)
class Handoff:
    """A request whose prompt a prefill rank computed, on its way to a decode rank.

    ``page_ids`` are the prefill rank's pages holding the prompt's K/V (in the pool's layout,
    MLA latent pages included), in sequence order; they stay pinned on the prefill rank until
    ``release_handoff(request_id)`` there (a ``HandoffReleased``).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    # Sequence j's first token (j = 0..n-1), all sampled from the prompt's last logits.
    first_token_ids: tuple[int, ...]
    # Sequence j's first token's logprobs (None unless ``sampling.logprobs`` is set).
    first_logprobs: tuple[TokenLogprobs | None, ...]
    # Every prompt token's logprobs from the second on (empty unless asked for).
    prompt_logprobs: tuple[TokenLogprobs, ...]
    # The prefill rank's pages holding the prompt's K/V, and how many tokens they hold (the
    # whole prompt: the first token's K/V is written by the decode rank's first decode).
    page_ids: tuple[int, ...]
    num_kv_tokens: int
    # The prefill rank that holds the pages (its index in the prefill group).
    source_rank: int = 0
    # A continuation's resumed tokens (``Request.num_resumed_tokens``): the prompt's last
    # ones are its own earlier output, so the decode rank counts them as output too.
    num_resumed_tokens: int = 0

    def __post_init__(self) -> None:
        n = self.sampling.n
        if len(self.first_token_ids) != n or len(self.first_logprobs) != n:
            raise ValueError(
                f"handoff {self.request_id!r}: {len(self.first_token_ids)} first tokens and "
                f"{len(self.first_logprobs)} logprobs for n={n} sequences"
            )
        if self.num_kv_tokens != len(self.prompt_token_ids):
            raise ValueError(
                f"handoff {self.request_id!r}: pages hold {self.num_kv_tokens} tokens, the "
                f"prompt has {len(self.prompt_token_ids)}"
            )

    @property
    def num_pages(self) -> int:
        return len(self.page_ids)

    @classmethod
    def of(
        cls,
        request: Request,
        forks: tuple[int, ...],
        fork_logprobs: tuple[TokenLogprobs | None, ...],
        source_rank: int = 0,
    ) -> Handoff:
        """The handoff of a request whose first token was just appended (sequence 0's), with
        the first tokens of sequences 1..n-1 and their logprobs."""
        first_lp = request.output_logprobs[0] if request.output_logprobs else None
        return cls(
            request_id=request.request_id,
            prompt_token_ids=tuple(request.prompt_token_ids),
            sampling=request.sampling,
            first_token_ids=(request.output_token_ids[0], *forks),
            first_logprobs=(first_lp, *fork_logprobs),
            prompt_logprobs=tuple(request.prompt_logprobs),
            page_ids=tuple(request.page_ids),
            num_kv_tokens=request.num_prompt_tokens,
            source_rank=source_rank,
            num_resumed_tokens=request.num_resumed_tokens,
        )

    def to_request(self) -> Request:
        """Sequence 0 as the decode rank holds it until its KV arrives: the prompt (and its
        logprobs), no K/V yet; its first token is appended when the KV has arrived."""
        req = Request(
            self.request_id,
            list(self.prompt_token_ids),
            self.sampling,
            num_resumed_tokens=self.num_resumed_tokens,
        )
        req.prompt_logprobs.extend(self.prompt_logprobs)
        req.status = RequestStatus.WAITING
        return req


@dataclass(frozen=True, slots=True, kw_only=True)
class KVReservation:
    """Pages a decode rank reserved for a handoff: the transfer may start.

    Page ``handoff.page_ids[page_indices[i]]`` on the prefill rank goes into
    ``target_page_ids[i]`` here; the handoff's other pages were prefix-cached on this rank and
    need not move (an empty ``page_indices``: nothing moves at all).
    """

    handoff: Handoff
    page_indices: tuple[int, ...]
    target_page_ids: tuple[int, ...]

    @property
    def request_id(self) -> str:
        return self.handoff.request_id

    @property
    def source_page_ids(self) -> tuple[int, ...]:
        """The prefill rank's pages to send, in ``target_page_ids`` order."""
        pages = self.handoff.page_ids
        return tuple(pages[i] for i in self.page_indices)

    @property
    def num_cached_pages(self) -> int:
        """The handoff's pages this rank already had (prefix caching): not transferred."""
        return self.handoff.num_pages - len(self.page_indices)


# ---- the ends of a transfer, as the rank that reported it applies them at its next round ----


@dataclass(frozen=True, slots=True)
class KVArrived:
    """Decode rank: the reserved pages of ``request_id`` hold its KV; it decodes from the
    next round (an unknown or ended id is ignored)."""

    request_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class KVFailed:
    """Decode rank: the transfer of ``request_id`` failed or timed out; it fails alone (its
    final event carries ``error``), its pages freed."""

    request_id: str
    error: str


@dataclass(frozen=True, slots=True)
class HandoffReleased:
    """Prefill rank: the transfer of handed-off ``request_id`` ended, either way (or no
    decode rank will take it): its pinned pages are freed."""

    request_id: str


# What ends a transfer: received (decode side) or sent (prefill side).
TransferEnd = KVArrived | KVFailed | HandoffReleased
