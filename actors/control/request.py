"""A request's lifecycle, counters and stop conditions."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RequestStatus(enum.IntEnum):
    """Ordered: every status at or after FINISHED_STOPPED is terminal."""

    WAITING = 0  # queued, schedulable, no pages
    LOADING = 1  # queued, not yet schedulable (e.g. a storage read); counts as new work
    PREFILLING = 2  # resident, prompt partly computed
    DECODING = 3  # prompt computed, generating one token a round
    RETRACTED = 4  # pages taken back under KV pressure; KV parked off-device until readmitted
    FINISHED_STOPPED = 5  # hit a stop token
    FINISHED_LENGTH = 6  # hit max_tokens or the context length
    FINISHED_ABORTED = 7  # cancelled by the client
    FINISHED_ERROR = 8  # failed alone: its planning or its forward/sampling raised (``error``)

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


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. ``temperature == 0`` is greedy."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


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
    num_computed_tokens: int = 0
    page_ids: list[int] = field(default_factory=list)
    arrival_round: int = 0
    # Round of the first published want for this prompt (admission-wait accounting).
    first_want_round: int | None = None
    first_prefill_round: int | None = None
    # Rounds the prompt was held for reasons the gate does not own (pressure or a full batch).
    excused_wait_rounds: int = 0
    # Why the request failed (status FINISHED_ERROR): a plain sentence for the client.
    error: str | None = None
    # Content keys of the sequence's full pages, computed as far as needed (prefix caching).
    page_keys: list[bytes] = field(default_factory=list)
    # The prompt never changes after construction, so its length is stored, not recounted:
    # the scheduler reads it for every running request every round.
    num_prompt_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: prompt must not be empty")
        self.num_prompt_tokens = len(self.prompt_token_ids)

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
        elif len(output) >= sampling.max_tokens or (
            max_model_len is not None and self.num_prompt_tokens + len(output) >= max_model_len
        ):
            self.status = RequestStatus.FINISHED_LENGTH
        else:
            return self.status >= _FIRST_FINISHED
        return True
