"""The data of one round: the scheduler's plan out, the executor's result back."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from roundgate.actors.control.handoff import KVReservation
from roundgate.actors.control.request import Request, TokenLogprobs
from roundgate.gate.permission import HOLD_ALL, Permission


class RoundKind(enum.StrEnum):
    IDLE = "idle"  # nothing to run on this rank
    DECODE = "decode"  # decodes only: the fast path (decode graph, DeepEP low-latency)
    PREFILL = "prefill"  # prefill chunks only
    MIXED = "mixed"  # decodes and prefill chunks in one batch


class ScheduledChunk(NamedTuple):
    """``num_tokens`` tokens of one request, starting at position ``start``.

    A decode is a chunk of one token (the last sampled one), or under speculative decoding
    that token and the request's drafts (``request.drafts``), verified in one forward. A
    prefill chunk extends the prompt; only the chunk that reaches the end of the prompt
    produces a sample.

    A named tuple rather than a frozen dataclass: one is built per running request per round,
    and a tuple is immutable too but several times cheaper to construct.
    """

    request: Request
    start: int
    num_tokens: int
    is_prefill: bool

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def samples(self) -> bool:
        """Whether the executor must sample a token after this chunk."""
        return self.end >= self.request.num_tokens

    @property
    def token_ids(self) -> list[int]:
        req = self.request
        drafts = req.drafts
        if not drafts or self.is_prefill:
            return req.token_ids(self.start, self.end)
        return req.token_ids(self.start, self.end - len(drafts)) + list(drafts)


@dataclass(slots=True)
class RoundPlan:
    """Everything one rank runs this round, in execution order."""

    # Prefill chunks and decodes to forward; page tables are on each chunk's request.
    chunks: list[ScheduledChunk] = field(default_factory=list)
    # Requests whose pages were taken back this round: the executor parks their KV
    # off-device *before* the pages are reused (their old page ids are given here).
    retracted: list[tuple[Request, list[int]]] = field(default_factory=list)
    # Retracted requests brought back into fresh pages: the executor restores their KV
    # (a cache operation, no prefill tokens).
    readmitted: list[Request] = field(default_factory=list)
    # (source, destination) pages to copy before the forward: a prompt whose every page is
    # cached recomputes its last token into a private copy of its last page.
    page_copies: list[tuple[int, int]] = field(default_factory=list)
    # Decode role: pages reserved this round for handoffs; each transfer may start now.
    reservations: list[KVReservation] = field(default_factory=list)
    # What exactly the policy allowed: new prompts, resident chunks, both or neither.
    permission: Permission = HOLD_ALL
    # (len(chunks), extends, prefill tokens, all tokens) from the last count. The counts are
    # read several times a round (the row, the executor, stats), so they are taken in one pass
    # and reused until the chunk list changes length: chunks are only appended or removed
    # (``unplan`` also drops the cache).
    _counts: tuple[int, int, int, int] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def unplan(self, req: Request) -> None:
        """Take ``req``'s chunks back out, its computed count with them (it was retracted or
        failed after they were planned: they would write into pages it no longer holds)."""
        chunks = self.chunks
        if not any(c.request is req for c in chunks):
            return
        for chunk in chunks:
            if chunk.request is req:
                # A verify chunk counted only its first token computed (its drafts count
                # once verification keeps them).
                req.num_computed_tokens -= chunk.num_tokens - (
                    0 if chunk.is_prefill else len(req.drafts)
                )
        req.drafts = ()
        chunks[:] = [c for c in chunks if c.request is not req]
        self._counts = None

    def counts(self) -> tuple[int, int, int, int]:
        """``(batch_size, num_extends, num_prefill_tokens, num_tokens)`` in one call."""
        counts = self._counts
        chunks = self.chunks
        if counts is None or counts[0] != len(chunks):
            extends = prefill_tokens = tokens = 0
            for chunk in chunks:
                tokens += chunk.num_tokens
                if chunk.is_prefill:
                    extends += 1
                    prefill_tokens += chunk.num_tokens
            counts = self._counts = (len(chunks), extends, prefill_tokens, tokens)
        return counts

    @property
    def num_extends(self) -> int:
        return self.counts()[1]

    @property
    def num_tokens(self) -> int:
        return self.counts()[3]

    @property
    def batch_size(self) -> int:
        return len(self.chunks)

    @property
    def num_decodes(self) -> int:
        counts = self.counts()
        return counts[0] - counts[1]

    @property
    def num_prefill_tokens(self) -> int:
        return self.counts()[2]

    @property
    def kind(self) -> RoundKind:
        size, extends, _, _ = self.counts()
        decodes = size - extends
        if extends and decodes:
            return RoundKind.MIXED
        if extends:
            return RoundKind.PREFILL
        if decodes:
            return RoundKind.DECODE
        return RoundKind.IDLE


@dataclass
class RoundResult:
    """What the executor returns: one sampled token per sampling chunk, and the round's cost."""

    # request_id -> sampled token, for every chunk whose ``samples`` is true.
    sampled: dict[str, int] = field(default_factory=dict)
    # Wall or simulated seconds the forward took (the simulator's clock advances by the
    # group's max of these plus overheads).
    cost_s: float = 0.0
    # request_id -> the sampled token's logprobs, for requests that asked for them.
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # request_id -> first tokens of sequences 1..n-1, sampled from the same logits as the
    # request's own first token (``sampling.n > 1``); their logprobs are in ``logprobs``
    # under ``sequence_id``. The executor has already saved the prompt's KV for each.
    forks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # request_id -> why, for requests the executor could not run this round (a bad input or a
    # sampling failure of that request alone): the scheduler fails just those requests.
    failed: dict[str, str] = field(default_factory=dict)
    # request_id -> logprobs of the prompt tokens this round's chunk of it predicted (in
    # order), for requests with ``sampling.prompt_logprobs``; empty otherwise.
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    # Speculative decoding: request_id -> the drafts verification kept, in order; they come
    # before the request's ``sampled`` token (absent: none kept, or no drafts).
    accepted: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Their logprobs, for requests that asked for them.
    accepted_logprobs: dict[str, tuple[TokenLogprobs, ...]] = field(default_factory=dict)
    # Drafts a model on the rank proposed for each request's next round (``mtp``,
    # ``draft_model``), continuing the tokens this round emitted.
    drafts: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Probe:
    """The two booleans a rank publishes to the gate each round."""

    wants_prefill: bool
    has_decode_work: bool


# The four possible probes, built once: the probe is taken twice per rank per round.
PROBES = {(w, d): Probe(w, d) for w in (False, True) for d in (False, True)}


class TokenEvent(NamedTuple):
    """A token appended to a request (``token_id`` None for a finish without a token).

    A named tuple: one is built per generated token, so construction cost matters.
    """

    request: Request
    token_id: int | None
    finished: bool
