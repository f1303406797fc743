"""The data of one round: the scheduler's plan out, the executor's result back."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from actors.request import Request


class RoundKind(enum.StrEnum):
    IDLE = "idle"  # nothing to run on this rank
    DECODE = "decode"  # decodes only: the fast path (decode graph, DeepEP low-latency)
    PREFILL = "prefill"  # prefill chunks only
    MIXED = "mixed"  # decodes and prefill chunks in one batch


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """``num_tokens`` tokens of one request, starting at position ``start``.

    A decode is a chunk of one token (the last sampled one). A prefill chunk extends the
    prompt; only the chunk that reaches the end of the prompt produces a sample.
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
        return self.request.token_ids(self.start, self.end)


@dataclass
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
    # Whether the gate let this rank plan prefill this round.
    allow_prefill: bool = False

    @property
    def num_extends(self) -> int:
        return sum(1 for c in self.chunks if c.is_prefill)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def batch_size(self) -> int:
        return len(self.chunks)

    @property
    def num_decodes(self) -> int:
        return sum(1 for c in self.chunks if not c.is_prefill)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if c.is_prefill)

    @property
    def kind(self) -> RoundKind:
        extends, decodes = self.num_extends, self.num_decodes
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
