"""A GGUF file's tensors, dequantized under their HF names (a ``TensorSource``).

The ``gguf`` package dequantizes every quant type it knows; llama.cpp's converter stores the Q
and K projections permuted for its interleaved RoPE, so they are permuted back to the HF
layout the model code expects. (``gguf_blocks`` keeps Q4_1/Q8_0 linears packed instead.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from roundgate.actors.model.config import ModelConfig
from roundgate.actors.model.gguf_file import read_header
from roundgate.actors.model.gguf_header import GGUFHeader, TensorInfo

# GGUF tensor name (per layer ``blk.{i}.``) -> HF parameter name.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


# Tensor types stored as plain numbers; every other type is blocks, read as bytes per row.
_PLAIN = {
    gguf.GGMLQuantizationType.F16: np.float16,
    gguf.GGMLQuantizationType.F32: np.float32,
    gguf.GGMLQuantizationType.F64: np.float64,
    gguf.GGMLQuantizationType.I8: np.int8,
    gguf.GGMLQuantizationType.I16: np.int16,
    gguf.GGMLQuantizationType.I32: np.int32,
    gguf.GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFTensor:
    """A tensor of the file as the loaders read it: the ``gguf`` package's record fields
    (``name``, ``tensor_type``, ``shape`` fastest dimension first) and ``data``."""

    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray  # a read-only view of the memory-mapped file


def map_tensor(header: GGUFHeader, info: TensorInfo) -> GGUFTensor:
    """The tensor's bytes laid out as the ``gguf`` package's reader lays them out (so its
    ``dequantize`` and the packed-block loader read them unchanged): plain types as their
    numpy dtype, block types as bytes per row (``quant_shape_to_byte_shape``), dimensions
    slowest first. A view of the memory map: nothing is read until it is used."""
    kind = gguf.GGMLQuantizationType(info.ggml_type)
    block, type_size = gguf.GGML_QUANT_SIZES[kind]
    elements = int(np.prod(info.shape, dtype=np.int64))
    dims = tuple(reversed(info.shape))
    if kind in _PLAIN:
        dtype, count = np.dtype(_PLAIN[kind]), elements
    else:
        dtype, count = np.dtype(np.uint8), elements * type_size // block
        dims = gguf.quants.quant_shape_to_byte_shape(dims, kind)
    start = header.data_offset + info.offset
    if start + count * dtype.itemsize > len(header.buffer):
        raise ValueError(f"{header.path}: tensor {info.name!r} runs past the end of the file")
    data = np.frombuffer(header.buffer, dtype=dtype, count=count, offset=start)
    return GGUFTensor(info.name, kind, info.shape, data.reshape(dims))


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head interleaving of the rotary halves (Q and K only)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


class GGUFSource:
    """A TensorSource over one GGUF file: HF names in, dequantized float32 tensors out."""

    def __init__(self, path: Path, config: ModelConfig) -> None:
        self.path = path
        self.config = config
        header = read_header(path)
        self._tensors = {t.name: map_tensor(header, t) for t in header.tensors}
        self._gguf_of = dict(self._names(config))

    @staticmethod
    def _names(config: ModelConfig) -> list[tuple[str, str]]:
        pairs = [(hf, g) for g, hf in _TOP_NAMES.items()]
        for i in range(config.num_layers):
            pairs += [(f"model.layers.{i}.{hf}", f"blk.{i}.{g}") for g, hf in _LAYER_NAMES.items()]
        return pairs

    def has(self, name: str) -> bool:
        return self._gguf_of.get(name) in self._tensors

    def permuted_heads(self, gguf_name: str) -> int | None:
        """The head count whose rows llama.cpp permuted in this tensor (Q and K), else None."""
        if gguf_name.endswith("attn_q.weight"):
            return self.config.num_heads
        if gguf_name.endswith("attn_k.weight"):
            return self.config.num_kv_heads
        return None

    def tensor_of(self, name: str) -> Any:
        """The file's tensor (the reader's record) under the HF name ``name``, or None."""
        gguf_name = self._gguf_of.get(name)
        return self._tensors.get(gguf_name) if gguf_name else None

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        gguf_name = self._gguf_of.get(name)
        tensor = self._tensors.get(gguf_name) if gguf_name else None
        if tensor is None:
            raise ValueError(f"{self.path}: tensor {gguf_name or name!r} is missing")
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise ValueError(
                f"{self.path}: tensor {tensor.name!r} has type {tensor.tensor_type.name}, "
                "which the gguf package cannot dequantize"
            ) from None
        values = np.asarray(values, dtype=np.float32)
        if values.shape != tuple(shape):
            raise ValueError(
                f"{self.path}: tensor {tensor.name!r} has shape {values.shape}, the metadata "
                f"implies {tuple(shape)}"
            )
        heads = self.permuted_heads(gguf_name)
        if heads is not None:
            values = unpermute(values, heads)
        # A copy: F32 tensors are read-only views of the memory-mapped file.
        return torch.from_numpy(np.array(values, dtype=np.float32, order="C", copy=True))
