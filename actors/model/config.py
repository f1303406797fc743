"""The shape of a model: one frozen dataclass, presets, and the HF ``config.json`` reader."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Byte-level tokenizer ids used by the presets (see actors/model/tokenizer.py): 0..255 are bytes.
BYTE_BOS_ID = 256
BYTE_EOS_ID = 257

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MixtralForCausalLM": "mixtral"}


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model, the KV cache and the loader need to know about a model.

    ``num_experts == 0`` is a dense Llama; otherwise every layer's MLP is a Mixtral-style
    sparse block of ``num_experts`` experts of width ``moe_intermediate_size``, ``top_k``
    routed per token.
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

    def __post_init__(self) -> None:
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
        if self.head_dim % 2:
            raise ValueError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_experts:
            if not 1 <= self.top_k <= self.num_experts:
                raise ValueError(
                    f"model config: top_k must be in 1..num_experts ({self.num_experts}), "
                    f"got {self.top_k}"
                )
            if self.moe_intermediate_size < 1:
                raise ValueError("model config: moe_intermediate_size must be >= 1 for MoE")
        elif self.intermediate_size < 1:
            raise ValueError("model config: intermediate_size must be >= 1 for a dense model")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def architecture(self) -> str:
        """The HF architecture name this config reads from and writes to."""
        return "MixtralForCausalLM" if self.is_moe else "LlamaForCausalLM"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` body that transformers (and ``from_hf_dict``) read back equal."""
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

    @classmethod
    def from_hf_dict(cls, body: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """Read a transformers ``config.json`` body; ``ValueError`` names ``source`` and field."""
        reader = _FieldReader(body, source)
        archs = reader.get("architectures", list)
        known = [a for a in archs if a in ARCHITECTURES]
        if not known:
            raise ValueError(
                f"{source}: architectures {archs} has none of the supported {sorted(ARCHITECTURES)}"
            )
        is_moe = ARCHITECTURES[known[0]] == "mixtral"
        act = reader.get("hidden_act", str, default="silu")
        if act != "silu":
            raise ValueError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
        if reader.get("sliding_window", object, default=None) is not None:
            raise ValueError(f"{source}: sliding_window attention is not supported")
        hidden = reader.get("hidden_size", int)
        heads = reader.get("num_attention_heads", int)
        head_dim = reader.get("head_dim", int, default=None) or hidden // heads
        intermediate = reader.get("intermediate_size", int)
        eos = reader.get("eos_token_id", object, default=None)
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        kwargs: dict[str, Any] = {
            "vocab_size": reader.get("vocab_size", int),
            "hidden_size": hidden,
            "num_layers": reader.get("num_hidden_layers", int),
            "num_heads": heads,
            "num_kv_heads": reader.get("num_key_value_heads", int, default=heads),
            "head_dim": head_dim,
            "intermediate_size": 0 if is_moe else intermediate,
            "rope_theta": _rope_theta(reader, source),
            "rms_norm_eps": reader.get("rms_norm_eps", float, default=1e-6),
            "max_position": reader.get("max_position_embeddings", int, default=4096),
            "tie_word_embeddings": reader.get("tie_word_embeddings", bool, default=False),
            "attention_bias": reader.get("attention_bias", bool, default=False),
            "mlp_bias": reader.get("mlp_bias", bool, default=False),
            "bos_token_id": reader.get("bos_token_id", int, default=None),
            "eos_token_ids": eos_ids,
        }
        if is_moe:
            kwargs["num_experts"] = reader.get("num_local_experts", int)
            kwargs["top_k"] = reader.get("num_experts_per_tok", int)
            kwargs["moe_intermediate_size"] = intermediate
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from exc

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        """Read ``<model_dir>/config.json``; errors name the missing or malformed file."""
        path = Path(model_dir) / "config.json"
        if not Path(model_dir).is_dir():
            raise ValueError(f"model directory {model_dir} does not exist")
        if not path.is_file():
            raise ValueError(f"{path}: missing (a HF model directory needs config.json)")
        return cls.from_hf_dict(read_json_object(path), source=str(path))


def read_json_object(path: Path) -> dict[str, Any]:
    """A model file holding one JSON object; errors name the file."""
    try:
        body = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(body).__name__}")
    return body


class _FieldReader:
    """Typed access to a config body, with errors naming the file and the field."""

    _MISSING = object()

    def __init__(self, body: dict[str, Any], source: str) -> None:
        self.body = body
        self.source = source

    def get(self, name: str, kind: type, default: Any = _MISSING) -> Any:
        if name not in self.body or self.body[name] is None:
            if default is self._MISSING:
                raise ValueError(f"{self.source}: required field {name!r} is missing")
            return default
        value = self.body[name]
        if kind is object:
            return value
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if (kind is not bool and isinstance(value, bool)) or not isinstance(value, kind):
            raise ValueError(
                f"{self.source}: field {name!r} must be {kind.__name__}, got {value!r}"
            )
        return value


def _rope_theta(reader: _FieldReader, source: str) -> float:
    """transformers 5 nests RoPE under ``rope_parameters``; 4.x used ``rope_theta``/scaling."""
    params = reader.get("rope_parameters", dict, default=None)
    scaling = reader.get("rope_scaling", dict, default=None)
    for block, name in ((params, "rope_parameters"), (scaling, "rope_scaling")):
        if block is None:
            continue
        kind = block.get("rope_type", block.get("type", "default"))
        if kind != "default":
            raise ValueError(f"{source}: {name} type {kind!r} is not supported (only 'default')")
    if params is not None and "rope_theta" in params:
        return float(params["rope_theta"])
    return reader.get("rope_theta", float, default=10000.0)


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
