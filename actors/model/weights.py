"""Weights in Hugging Face naming: seeded random presets, ``*.safetensors`` directories, export.

Everything speaks HF parameter names (``model.layers.0.self_attn.q_proj.weight``...), so a
preset and a checkpoint go through the same loader, and a preset can be exported for
transformers to read (tests and benchmarks compare against it that way).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from roundgate.actors.model.config import ModelConfig, read_json_object


class TensorSource(Protocol):
    """Named tensors in HF naming; ``get`` raises ``ValueError`` naming where it looked."""

    def has(self, name: str) -> bool: ...

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor: ...


def hf_param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every HF parameter of ``config`` and its shape, in a fixed order (the seed order)."""
    h, q, kv = config.hidden_size, config.q_size, config.kv_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        if config.attention_bias:
            for name, size in (("q", q), ("k", kv), ("v", kv)):
                shapes[p + f"self_attn.{name}_proj.bias"] = (size,)
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if config.is_moe:
            inter = config.moe_intermediate_size
            shapes[p + "block_sparse_moe.gate.weight"] = (config.num_experts, h)
            for e in range(config.num_experts):
                shapes[p + f"block_sparse_moe.experts.{e}.w1.weight"] = (inter, h)
                shapes[p + f"block_sparse_moe.experts.{e}.w2.weight"] = (h, inter)
                shapes[p + f"block_sparse_moe.experts.{e}.w3.weight"] = (inter, h)
        else:
            inter = config.intermediate_size
            shapes[p + "mlp.gate_proj.weight"] = (inter, h)
            shapes[p + "mlp.up_proj.weight"] = (inter, h)
            shapes[p + "mlp.down_proj.weight"] = (h, inter)
            if config.mlp_bias:
                shapes[p + "mlp.gate_proj.bias"] = (inter,)
                shapes[p + "mlp.up_proj.bias"] = (inter,)
                shapes[p + "mlp.down_proj.bias"] = (h,)
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def random_hf_state(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded float32 weights: identical on every rank and every run for the same seed.

    Linear weights are N(0, 1/fan_in) so activations keep unit scale and the logits are
    far from uniform (greedy comparisons then have clear winners); norms start at one.
    """
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in hf_param_shapes(config).items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            state[name] = torch.randn(shape, generator=gen) * 0.02
        elif name == "model.embed_tokens.weight":
            state[name] = torch.randn(shape, generator=gen)
        else:
            state[name] = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
    return state


class DictSource:
    """A TensorSource over an in-memory HF state dict (the presets)."""

    def __init__(self, state: dict[str, torch.Tensor], label: str) -> None:
        self.state = state
        self.label = label

    def has(self, name: str) -> bool:
        return name in self.state

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self.state:
            raise ValueError(f"{self.label}: tensor {name!r} is missing")
        return _check_shape(self.state[name], name, shape, self.label)


class SafetensorsSource:
    """A TensorSource over a directory's safetensors: the shards ``model.safetensors.index.json``
    names (a sharded checkpoint), else every ``*.safetensors`` file; opened lazily."""

    INDEX = "model.safetensors.index.json"

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        index = self.model_dir / self.INDEX
        if index.is_file():
            files = self._shards(index)
        else:
            files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{self.model_dir}: no *.safetensors weight files found")
        self._file_of: dict[str, Path] = {}
        self.dtypes: dict[str, str] = {}  # name -> safetensors dtype ("F8_E4M3", "BF16"...)
        self.numels: dict[str, int] = {}
        for path in files:
            try:
                with safe_open(str(path), framework="pt") as handle:
                    for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                        self._file_of[key] = path
                        view = handle.get_slice(key)
                        self.dtypes[key] = view.get_dtype()
                        self.numels[key] = math.prod(view.get_shape())
            except Exception as exc:  # safetensors raises its own error types
                raise ValueError(f"{path}: unreadable safetensors file ({exc})") from exc

    def _shards(self, index: Path) -> list[Path]:
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: weight_map must be a non-empty object")
        shards = sorted({self.model_dir / str(f) for f in weight_map.values()})
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise ValueError(f"{index}: shard {missing[0]} is missing from {self.model_dir}")
        return shards

    def has(self, name: str) -> bool:
        return name in self._file_of

    def names(self) -> list[str]:
        """Every tensor name in the checkpoint."""
        return list(self._file_of)

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        path = self._file_of.get(name)
        if path is None:
            raise ValueError(
                f"{self.model_dir}: tensor {name!r} is missing from the *.safetensors files"
            )
        with safe_open(str(path), framework="pt") as handle:
            tensor = handle.get_tensor(name)
        return _check_shape(tensor, name, shape, str(path))


def _check_shape(
    tensor: torch.Tensor, name: str, shape: tuple[int, ...], label: str
) -> torch.Tensor:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(
            f"{label}: tensor {name!r} has shape {tuple(tensor.shape)}, config.json implies "
            f"{tuple(shape)}"
        )
    return tensor


def save_hf_dir(config: ModelConfig, state: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` that transformers loads as-is."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    return out


class ReadTracker:
    """A TensorSource wrapper that records which names the loader read."""

    def __init__(self, inner: TensorSource) -> None:
        self.inner = inner
        self.read: set[str] = set()

    def has(self, name: str) -> bool:
        return self.inner.has(name)

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        self.read.add(name)
        return self.inner.get(name, shape)

    @property
    def keep_fp8(self) -> bool:
        """The inner source's FP8 choice (``actors/model/fp8.py``); False for other formats."""
        return bool(getattr(self.inner, "keep_fp8", False))

    def get_fp8(self, name: str, shape: tuple[int, ...]) -> Any:
        """The inner source's ``get_fp8`` (codes and block scales as stored), recorded as a read;
        None where the inner source has no FP8 tensors."""
        get_fp8 = getattr(self.inner, "get_fp8", None)
        if get_fp8 is None:
            return None
        self.read.add(name)
        return get_fp8(name, shape)


def unread_tensors(names: list[str], read: set[str], num_layers: int) -> list[str]:
    """Checkpoint tensors the architecture did not read: a sign of a mislabelled checkpoint
    (a Qwen3 labelled Llama would silently lose its q/k norms).

    Not counted: experts (a rank reads only its own), FP8 scales (read with their weight),
    layers past ``num_layers`` (DeepSeek-V3's multi-token-prediction layer) and RoPE buffers.
    """
    unread = []
    for name in names:
        if name in read or ".experts." in name or name.endswith("_scale_inv"):
            continue
        if name.endswith("rotary_emb.inv_freq"):
            continue
        parts = name.split(".")
        if parts[:2] == ["model", "layers"] and parts[2].isdigit() and int(parts[2]) >= num_layers:
            continue
        unread.append(name)
    return unread
