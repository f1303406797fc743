"""The control plane's own configs: what a rank's scheduler and KV pool read, and nothing else.

Both are frozen and built once from the validated ``ServerArgs`` (``from_args``); the simulator
and the tests build them the same way, or directly. They read attributes only, so anything
with the ``ServerArgs`` names will do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from roundgate.actors.control.speculative_config import SpeculativeConfig
from roundgate.actors.role import DisaggregationRole


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One rank's KV pool: ``num_pages`` pages of ``page_size`` tokens."""

    num_pages: int
    page_size: int

    def __post_init__(self) -> None:
        if self.num_pages < 1:
            raise ValueError(f"--num-kv-pages must be >= 1, got {self.num_pages}")
        if self.page_size < 1:
            raise ValueError(f"--page-size must be >= 1, got {self.page_size}")

    @classmethod
    def from_args(cls, args: Any) -> PoolConfig:
        """The pool of a rank of ``args`` (a ``ServerArgs``)."""
        return cls(args.num_kv_pages, args.page_size)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """One rank's scheduler: its pool, its limits, and its P/D role."""

    pool: PoolConfig
    # Running requests the rank may hold (``--max-num-seqs`` / ``--dp-size``).
    max_batch_size: int
    # Tokens one round may plan (``--max-scheduled-tokens``).
    max_scheduled_tokens: int
    # The context length; None: no model (the simulator), only the pool bounds a sequence.
    max_model_len: int | None
    # Token ids a prompt may hold: [0, vocab_size).
    vocab_size: int
    enable_prefix_caching: bool = False
    # Decodes and prefill chunks in one round (else a round with prefill runs it alone).
    enable_mixed_prefill_decode: bool = False
    disaggregation_mode: DisaggregationRole = DisaggregationRole.FUSED
    # Speculative decoding's drafts (None: every decode is one token).
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"--max-num-seqs gives {self.max_batch_size} slots per rank")
        if self.max_scheduled_tokens < 1:
            raise ValueError(
                f"--max-scheduled-tokens must be >= 1, got {self.max_scheduled_tokens}"
            )

    @classmethod
    def from_args(cls, args: Any) -> SchedulerConfig:
        """The scheduler of a rank of ``args`` (a ``ServerArgs``)."""
        return cls(
            pool=PoolConfig.from_args(args),
            max_batch_size=args.max_batch_size,
            max_scheduled_tokens=args.max_scheduled_tokens,
            max_model_len=args.max_model_len,
            vocab_size=args.model_config.vocab_size,
            enable_prefix_caching=args.enable_prefix_caching,
            enable_mixed_prefill_decode=args.enable_mixed_prefill_decode,
            disaggregation_mode=args.disaggregation_mode,
            speculative=getattr(args, "speculative", None),
        )

    def replace(self, **changes: Any) -> SchedulerConfig:
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)
