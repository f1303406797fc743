"""A request's lifecycle, counters and stop conditions."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple


class RequestStatus(enum.IntEnum):
    """Ordered: every status at or after FINISHED_STOPPED is terminal."""

    WAITING = 0  # queued, schedulable, no pages
    LOADING = 1  # queued, not yet schedulable (e.g. a storage read); counts as new work
    # Queued on a decode rank with its pages reserved: another rank's KV is being written
    # into them (vLLM's WAITING_FOR_REMOTE_KVS); not schedulable until it has arrived.
    WAITING_FOR_REMOTE_KV = 2
    PREFILLING = 3  # resident, prompt partly computed
    DECODING = 4  # prompt computed, generating one token a round
    RETRACTED = 5  # pages taken back under KV pressure; KV parked off-device until readmitted
    FINISHED_STOPPED = 6  # hit a stop token
    FINISHED_LENGTH = 7  # hit max_tokens or the context length
    FINISHED_ABORTED = 8  # cancelled by the client
    FINISHED_ERROR = 9  # failed alone: its planning or its forward/sampling raised (``error``)

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


# The first terminal status, as a plain comparison bound for the per-token hot path.
_FIRST_FINISHED = RequestStatus.FINISHED_STOPPED

FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class TokenLogprobs(NamedTuple):
    """The raw model log-probability of a sampled token and the ``k`` most likely tokens.

    Taken from the model's distribution before any sampling transform (penalties, bias,
    temperature, cuts, grammar), as vLLM does by default.
    """

    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]
    # The token's rank in the distribution (1: the likeliest); set for prompt tokens, whose
    # vLLM shape reports it.
    rank: int | None = None


# How many top logprobs a request may ask for per token unless the deployment says otherwise
# (``max_logprobs``), vLLM's default; a rank computes any number up to its vocabulary.
DEFAULT_MAX_LOGPROBS = 20
MAX_N = 64  # sequences per prompt
_SEQUENCE_SEED_MIX = 0xD1B54A32D192ED03  # spreads a seed's sequences apart


def sequence_id(request_id: str, index: int) -> str:
    """The scheduler id of sequence ``index`` (>= 1) forked from ``request_id``."""
    return f"{request_id}#{index}"


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. ``temperature == 0`` is greedy.

    Transforms, in the order the sampler applies them: ``logit_bias`` (added), ``min_tokens``
    (stop tokens masked until that many were generated), ``repetition_penalty`` (over prompt
    and output, as transformers), ``frequency_penalty`` / ``presence_penalty`` (over the
    output, as OpenAI), the grammar mask, then greedy, or temperature, top-k, top-p, min-p.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    min_p: float = 0.0
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), token ids distinct
    logprobs: int | None = None  # None: none; k: the sampled token's and the top k
    # None: none; k: every prompt token's logprob (from the second on) and the top k there.
    # Computed by the runner only when set; such a prompt never starts on cached pages.
    prompt_logprobs: int | None = None
    # (kind, spec) of a grammar the output must follow (actors.model.grammar); None: free.
    grammar: tuple[str, str] | None = None
    # Sequences sampled from one prompt: the prompt is prefilled once, then forked.
    n: int = 1
    # Whether any transform beyond temperature/top-k/top-p applies: the sampler's fast path
    # reads this once per row instead of comparing every field.
    needs_transforms: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens {self.max_tokens}], got {self.min_tokens}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 100:
            raise ValueError(
                f"repetition_penalty must be in (0, 100], got {self.repetition_penalty}"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 (or None), got {value}")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {self.n}")
        if len({t for t, _ in self.logit_bias}) != len(self.logit_bias):
            raise ValueError("logit_bias: a token id appears twice")
        transforms = bool(
            self.min_tokens
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1
            or self.logit_bias
            or self.grammar is not None
            or (self.temperature > 0 and self.min_p > 0)
        )
        object.__setattr__(self, "needs_transforms", transforms)

    def for_sequence(self, index: int) -> SamplingParams:
        """The sampling of sequence ``index`` of ``n``: one sequence, its own seeded stream
        (sequence 0 keeps the request's seed, so ``n=1`` and sequence 0 agree)."""
        seed = self.seed
        if seed is not None and index:
            seed = (seed + index * _SEQUENCE_SEED_MIX) % (1 << 63)
        return replace(self, n=1, seed=seed)

    def check_vocab(self, vocab_size: int) -> None:
        """Refuse token ids (bias, stop ids) outside the model's vocabulary, naming one, and
        more top logprobs per token than the vocabulary has."""
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value > vocab_size:
                raise ValueError(f"{name}: {value} exceeds the vocabulary size {vocab_size}")
        for name, ids in (
            ("logit_bias", [t for t, _ in self.logit_bias]),
            ("stop_token_ids", self.stop_token_ids),
        ):
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise ValueError(
                    f"{name}: token id {bad} is outside the vocabulary [0, {vocab_size})"
                )

    @property
    def needs_history(self) -> bool:
        """Whether the sampler must see the request's tokens (penalties)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)


@dataclass(eq=False)
class Request:
    """One generation request on one rank.

    ``num_computed_tokens`` counts tokens whose K/V are in the cache. While decoding it trails
    ``num_tokens`` by one: the last sampled token is fed in the next round.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # One entry per output token when ``sampling.logprobs`` is set (appended by the scheduler
    # from the executor's result), else empty.
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    # One entry per prompt token from the second on when ``sampling.prompt_logprobs`` is set
    # (appended chunk by chunk as the prefill runs), else empty.
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    num_computed_tokens: int = 0
    page_ids: list[int] = field(default_factory=list)
    arrival_round: int = 0
    # A forked sequence's index among its prompt's ``n``, and the id of the request whose
    # stream carries its tokens (None: its own).
    index: int = 0
    stream_id: str | None = None
    # The executor's grammar matcher for this request (structured output), built on first
    # use; it lives and dies with the request. The control plane never reads it.
    grammar_state: Any = field(default=None, repr=False)
    # Round of the first published want for this prompt (admission-wait accounting).
    first_want_round: int | None = None
    first_prefill_round: int | None = None
    # Rounds the prompt was held for reasons the gate does not own (pressure or a full batch).
    excused_wait_rounds: int = 0
    # Why the request failed (status FINISHED_ERROR): a plain sentence for the client.
    error: str | None = None
    # Content keys of the sequence's full pages, computed as far as needed (prefix caching).
    page_keys: list[bytes] = field(default_factory=list)
    # A continuation (``roundgate.deployment.resume``): the prompt's last ``num_resumed_tokens``
    # tokens are this request's own earlier output, streamed by a rank that died. They count toward
    # ``max_tokens`` and seeded draws, penalties and the grammar see them as output.
    num_resumed_tokens: int = 0
    # This round's draft tokens (speculative decoding): set by the planner with the decode
    # chunk that verifies them, cleared when the round's result is applied.
    drafts: tuple[int, ...] = ()
    # Verifications in a row that kept none of this request's drafts, and the rounds it
    # still decodes without drafts because of them (``Speculator``'s back-off).
    draft_misses: int = 0
    draft_pause: int = 0
    # The most drafts its next verification carries (0: ``num_speculative_tokens``).
    draft_cap: int = 0
    # The request's n-gram index for prompt lookup (``NgramIndex``), built on first use.
    draft_index: Any = field(default=None, repr=False)
    # Drafts a model proposed after the last round (``mtp``, ``draft_model``): what its next
    # verification may carry (``RoundResult.drafts``).
    proposed_drafts: tuple[int, ...] = ()
    # The prompt never changes after construction, so its length is stored, not recounted:
    # the scheduler reads it for every running request every round.
    num_prompt_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: prompt must not be empty")
        self.num_prompt_tokens = len(self.prompt_token_ids)
        if not 0 <= self.num_resumed_tokens < self.num_prompt_tokens:
            raise ValueError(
                f"request {self.request_id}: num_resumed_tokens {self.num_resumed_tokens} "
                f"must be in [0, prompt length {self.num_prompt_tokens})"
            )

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    @property
    def num_uncomputed_prompt_tokens(self) -> int:
        return max(0, self.num_prompt_tokens - self.num_computed_tokens)

    @property
    def is_finished(self) -> bool:
        return self.status >= _FIRST_FINISHED

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def token_ids(self, start: int, stop: int) -> list[int]:
        """Tokens ``[start, stop)`` of prompt followed by output."""
        prompt_len = self.num_prompt_tokens
        if stop <= prompt_len:
            return self.prompt_token_ids[start:stop]
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len : stop - prompt_len]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - prompt_len]

    def append_token(self, token_id: int, max_model_len: int | None = None) -> bool:
        """Record a sampled token and apply the stop conditions; returns whether it finished."""
        output = self.output_token_ids
        output.append(token_id)
        sampling = self.sampling
        if token_id in sampling.stop_token_ids:
            self.status = RequestStatus.FINISHED_STOPPED
        elif len(output) + self.num_resumed_tokens >= sampling.max_tokens or (
            max_model_len is not None and self.num_prompt_tokens + len(output) >= max_model_len
        ):
            self.status = RequestStatus.FINISHED_LENGTH
        else:
            return self.status >= _FIRST_FINISHED
        return True
