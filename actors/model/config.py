"""The shape of a model: one frozen dataclass and the presets.

The readers of a HF ``config.json`` live in ``actors/model/families/`` (one module per family,
``read_model_dir`` the entry point); this module holds only what every family shares, so the
runner, the KV pool sizing and the loader read one dataclass whatever the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roundgate.actors.model.config_parts import MLAConfig, RopeScaling, RouterConfig

# Byte-level tokenizer ids used by the presets (see actors/model/tokenizer.py): 0..255 are bytes.
BYTE_BOS_ID = 256
BYTE_EOS_ID = 257


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model, the KV cache and the loader need to know about a model.

    ``num_experts == 0`` is dense; otherwise every layer not in ``dense_layers`` has a sparse
    block of ``num_experts`` experts of width ``moe_intermediate_size`` (``top_k`` routed per
    token by ``router``), plus an always-on shared expert of width
    ``shared_expert_intermediate_size`` when that is set (scaled by a sigmoid gate when
    ``shared_expert_gate``). ``mla`` set means DeepSeek latent attention instead of GQA.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position: int = 4096
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = BYTE_BOS_ID
    eos_token_ids: tuple[int, ...] = (BYTE_EOS_ID,)
    # "" = derived: LlamaForCausalLM, or MixtralForCausalLM with experts.
    architecture: str = ""
    qkv_bias: bool = False  # q/k/v biases without an o_proj bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    router: RouterConfig = field(default_factory=RouterConfig)
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    mla: MLAConfig | None = None
    # FP8 block-scaled checkpoint (quant_method fp8): the [rows, cols] block of one scale.
    weight_block_size: tuple[int, int] | None = None
    # Multi-token-prediction layers the checkpoint carries after its ``num_layers``
    # (DeepSeek-V3's ``num_nextn_predict_layers``: one), and how many of them this deployment
    # runs to draft (``speculative_config`` method ``mtp``): each run one caches its own K/V
    # beside the model's layers, at cache layer ``num_layers + i``.
    num_nextn_predict_layers: int = 0
    draft_layers: int = 0

    def __post_init__(self) -> None:
        if not self.architecture:
            name = "MixtralForCausalLM" if self.num_experts else "LlamaForCausalLM"
            object.__setattr__(self, "architecture", name)
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"model config: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model config: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.rope_dim % 2:
            raise ValueError(f"model config: the RoPE dimension must be even, got {self.rope_dim}")
        if self.num_experts:
            if not 1 <= self.top_k <= self.num_experts:
                raise ValueError(
                    f"model config: top_k must be in 1..num_experts ({self.num_experts}), "
                    f"got {self.top_k}"
                )
            if self.moe_intermediate_size < 1:
                raise ValueError("model config: moe_intermediate_size must be >= 1 for MoE")
            if self.num_experts % self.router.n_group:
                raise ValueError(
                    f"model config: n_group ({self.router.n_group}) must divide the "
                    f"{self.num_experts} experts"
                )
            if self.top_k > self.router.topk_group * (self.num_experts // self.router.n_group):
                raise ValueError("model config: top_k exceeds the experts of topk_group groups")
        if self.num_nextn_predict_layers < 0:
            raise ValueError(
                "model config: num_nextn_predict_layers must be >= 0, got "
                f"{self.num_nextn_predict_layers}"
            )
        if not 0 <= self.draft_layers <= self.num_nextn_predict_layers:
            raise ValueError(
                f"model config: draft_layers ({self.draft_layers}) must be within the "
                f"checkpoint's {self.num_nextn_predict_layers} next-n layers"
            )
        bad = [i for i in self.dense_layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"model config: dense layer {bad[0]} is not a layer index")
        has_dense = any(not self.is_moe_layer(i) for i in range(self.num_layers))
        if has_dense and self.intermediate_size < 1:
            raise ValueError("model config: intermediate_size must be >= 1 for a dense MLP")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is the sparse block (else the dense SwiGLU)."""
        return self.is_moe and layer not in self.dense_layers

    @property
    def num_cache_layers(self) -> int:
        """Layers the KV cache holds: the model's, then the next-n layers that draft."""
        return self.num_layers + self.draft_layers

    @property
    def rope_dim(self) -> int:
        """The rotated width of a head: all of it, or MLA's RoPE part."""
        return self.mla.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, element_size: int) -> int:
        """KV-cache bytes one token costs on one rank, every layer together.

        MLA caches its latent and RoPE key (``kv_lora_rank + qk_rope_head_dim`` values a
        layer); GQA caches K and V of every KV head (``2 * num_kv_heads * head_dim``).
        """
        width = self.mla.latent_width if self.mla else 2 * self.kv_size
        return width * self.num_cache_layers * element_size

    def to_hf_dict(self) -> dict[str, Any]:
        """A Llama/Mixtral ``config.json`` body that transformers (and
        ``families.read_hf_config``) read back equal (the presets are written this way)."""
        if self.architecture not in ("LlamaForCausalLM", "MixtralForCausalLM"):
            raise ValueError(f"to_hf_dict writes Llama/Mixtral configs, not {self.architecture}")
        body: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": "mixtral" if self.is_moe else "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": (
                self.moe_intermediate_size if self.is_moe else self.intermediate_size
            ),
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids),
            "torch_dtype": "float32",
        }
        if self.is_moe:
            body["num_local_experts"] = self.num_experts
            body["num_experts_per_tok"] = self.top_k
        else:
            body["attention_bias"] = self.attention_bias
            body["mlp_bias"] = self.mlp_bias
        return body


def read_json_object(path: Path) -> dict[str, Any]:
    """A model file holding one JSON object; errors name the file."""
    try:
        body = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(body).__name__}")
    return body


PRESETS: dict[str, ModelConfig] = {
    # Sized to run fast on two CPU cores while still exercising GQA (4 q heads over 2 kv
    # heads), several layers, and positions long enough for a 2,048-token prompt.
    "tiny-llama": ModelConfig(
        vocab_size=512,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=256,
        max_position=4096,
    ),
    "tiny-moe": ModelConfig(
        vocab_size=512,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=0,
        max_position=4096,
        num_experts=4,
        top_k=2,
        moe_intermediate_size=128,
        rms_norm_eps=1e-5,
    ),
}


def with_overrides(config: ModelConfig, **changes: Any) -> ModelConfig:
    """A validated copy of ``config`` (tests and benchmarks build variants with this)."""
    return dataclasses.replace(config, **changes)
