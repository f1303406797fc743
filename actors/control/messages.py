"""The messages between the ingress and a rank: one typed message each way.

The ingress tokenizes, builds and validates ``SamplingParams`` once, and sends a
``GenerateRequest``; the rank streams ``GenerateChunk``s back. Both are frozen dataclasses
that Ray pickles as they are, so nothing is rebuilt from a dict on the other side, and the
request id the client sees in logs and metrics is the one the scheduler holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from roundgate.actors.control.request import Request, SamplingParams, TokenLogprobs


@dataclass(frozen=True, slots=True)
class RankTarget:
    """Steers a call to one rank of a group (``dp_rank``); None lets the router choose. With
    several groups, ``gang_id`` (the ``group`` label of the rank's metrics) names the group;
    without it a pinned call goes to one fixed group's rank of that number."""

    dp_rank: int | None = None
    gang_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateRequest:
    """One sequence to generate: token ids in, sampling as validated at the ingress."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    dp_rank: int | None = None  # pin to one rank of the group (the routers read it)
    session_id: str | None = None  # the client's ``user``: the cache-aware router's affinity key
    # A continuation: the prompt's last tokens are this request's earlier output
    # (``Request.num_resumed_tokens``; the ingress builds it in ``roundgate.deployment.resume``).
    num_resumed_tokens: int = 0

    def to_request(self) -> Request:
        return Request(
            self.request_id,
            list(self.prompt_token_ids),
            self.sampling,
            num_resumed_tokens=self.num_resumed_tokens,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Tokens of one sequence so far (the prompt counted once)."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateChunk:
    """New token ids since the last chunk; ``finish_reason`` is set on the last one.

    ``error`` is set (with ``finish_reason`` ``"error"``) when the rank refused or failed this
    request alone: the client gets ``error_status`` with it (400: the request cannot run
    here; 500: it failed while running), and the group goes on serving.
    """

    token_ids: tuple[int, ...]
    finish_reason: str | None
    usage: Usage
    error: str | None = None
    # One entry per token in ``token_ids`` when the request asked for logprobs.
    logprobs: tuple[TokenLogprobs, ...] | None = None
    index: int = 0  # which of the request's ``sampling.n`` sequences the tokens belong to
    error_status: int = 400
    # On the first chunk of sequence 0 when ``sampling.prompt_logprobs`` is set: one entry
    # per prompt token from the second on (the prefill is over before the first token).
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None
