"""The sub-configs of ``ModelConfig`` that only some families use: RoPE scaling, MoE
routing, latent attention. Frozen dataclasses validated with errors naming the field."""

from __future__ import annotations

from dataclasses import dataclass

ROPE_KINDS = ("default", "llama3", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (``rope_parameters``/``rope_scaling``); ``default`` is none.

    ``llama3`` reads factor, low/high_freq_factor and original_max_position; ``yarn`` reads
    factor, beta_fast/slow, mscale/mscale_all_dim (or an explicit attention_factor),
    original_max_position and truncate — the fields transformers' rope functions read.
    """

    kind: str = "default"
    factor: float = 1.0
    original_max_position: int = 0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise ValueError(f"rope type {self.kind!r} is not supported ({', '.join(ROPE_KINDS)})")
        if self.kind != "default" and self.original_max_position < 1:
            raise ValueError(f"rope type {self.kind!r} needs original_max_position_embeddings")


@dataclass(frozen=True)
class RouterConfig:
    """How an MoE layer picks its experts.

    ``scoring``: ``softmax`` (Mixtral, Qwen, DeepSeek-V2) or ``sigmoid`` (DeepSeek-V3, whose
    choice adds ``e_score_correction_bias``). ``topk_method``: ``greedy`` (plain top-k),
    ``group_limited_greedy`` (V2: the ``topk_group`` best of ``n_group`` groups by their best
    expert) or ``noaux_tc`` (V3: groups ranked by the sum of their two best biased scores).
    """

    scoring: str = "softmax"
    topk_method: str = "greedy"
    norm_topk_prob: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"scoring_func {self.scoring!r} is not supported (softmax, sigmoid)")
        methods = ("greedy", "group_limited_greedy", "noaux_tc")
        if self.topk_method not in methods:
            raise ValueError(f"topk_method {self.topk_method!r} is not supported {methods}")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(
                f"topk_group ({self.topk_group}) must be in 1..n_group ({self.n_group})"
            )

    @property
    def is_grouped(self) -> bool:
        return self.topk_method != "greedy"


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): K/V live as one ``kv_lora_rank`` latent
    per token plus one shared ``qk_rope_head_dim`` RoPE key; queries optionally go through a
    ``q_lora_rank`` bottleneck. ``rope_interleave``: RoPE pairs are adjacent (x0, x1)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_width(self) -> int:
        """Cached values per token and layer: the latent and the RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim
