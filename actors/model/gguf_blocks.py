"""GGUF linear weights kept block-quantized (``--gguf-weights packed`` or ``int8-dot``).

The loader fills every layer with dequantized float32 weights first (one path for every
source). Then, for a GGUF model on the CPU, each linear layer whose checkpoint tensors are
Q4_0, Q4_1 or Q8_0 (all parts of a fused layer the same type) is swapped for a ``BlockLinear``
over the file's own blocks, copied byte for byte from the memory-mapped file (fused
projections concatenate their parts' rows, Q/K rows un-permuted as the float path does). A swap
happens only when the packed weight dequantizes to exactly the float32 weight it replaces on
rows sampled over every part (``_check_rows``), so a mapping that does not fit a model does
not change results. Other types (the K-quants among
them) keep their float32 weights: see ``roundgate.kernels.quant``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from roundgate.actors.model.gguf_source import GGUFSource, unpermute
from roundgate.kernels.quant import (
    BLOCK,
    FORMATS,
    BlockLinear,
    BlockWeights,
    kernel,
    kernel_failure,
)

logger = logging.getLogger("roundgate.model")

# The decoder's fused linear layers and the checkpoint tensors they hold, in row order.
_LAYER_LINEARS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}


def read_blocks(source: GGUFSource, name: str) -> BlockWeights | None:
    """The HF tensor ``name`` as the file's blocks, if its type is one in ``FORMATS``."""
    tensor = source.tensor_of(name)
    if tensor is None or tensor.tensor_type.name not in FORMATS:
        return None
    raw = np.asarray(tensor.data, dtype=np.uint8)  # [rows, row bytes]
    heads = source.permuted_heads(tensor.name)
    if heads is not None:  # whole rows move: the blocks within a row stay as they are
        raw = unpermute(raw, heads)
    width = int(tensor.shape[0])  # GGUF lists the fastest-varying dimension first
    data = torch.from_numpy(np.array(raw, order="C"))
    return BlockWeights(data, FORMATS[tensor.tensor_type.name], width)


def weight_path(model: nn.Module) -> str:
    """Which weights the model's linear layers run on: ``int8-dot`` or ``packed`` when any
    layer is block-quantized, else ``float`` (what ``/metrics`` reports per rank)."""
    packed = [m for m in model.modules() if isinstance(m, BlockLinear)]
    if not packed:
        return "float"
    return "int8-dot" if any(m.int8_dot for m in packed) else "packed"


def decode_weight_bytes(model: nn.Module) -> int:
    """Bytes of linear weights one decode step reads (every linear layer's weight once; the
    embedding lookup reads one row and is left out)."""
    total = 0
    for module in model.modules():
        if isinstance(module, BlockLinear):
            total += module.weights.nbytes
        elif isinstance(module, nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total


def pack_gguf(model: nn.Module, source: object, tied: bool, int8_dot: bool = False) -> int:
    """Swap the model's linear layers for packed ones where the file allows; returns how many
    (0 for a source that is not a GGUF file). ``int8_dot``: they run llama.cpp's integer dot
    products instead of the exact float32 ones.

    Falls back to the float32 weights (and says why) when the kernel cannot run here.
    """
    if not isinstance(source, GGUFSource):
        return 0
    if kernel() is None:
        logger.warning("GGUF weights stay float32: %s", kernel_failure())
        return 0
    plan: list[tuple[str, Sequence[str]]] = [
        ("lm_head", ("model.embed_tokens" if tied else "lm_head",))
    ]
    for i in range(source.config.num_layers):
        for module, parts in _LAYER_LINEARS.items():
            plan.append((f"layers.{i}.{module}", [f"model.layers.{i}.{p}" for p in parts]))
    swapped, before, after = 0, 0, 0
    for path, parts in plan:
        linear = _linear_at(model, path)
        if linear is None or linear.bias is not None or linear.in_features % BLOCK:
            continue
        blocks = [read_blocks(source, p + ".weight") for p in parts]
        if any(b is None for b in blocks):
            continue
        packed = BlockWeights.cat(blocks)  # type: ignore[arg-type]
        if packed is None:
            logger.info("%s: its parts are stored in different block types; kept float", path)
            continue
        rows = _check_rows([b.shape[0] for b in blocks])  # type: ignore[union-attr]
        sample = BlockWeights(packed.data[rows], packed.format, packed.in_features)
        if not torch.equal(sample.dequantize(), linear.weight.float()[rows]):
            logger.warning("%s: packed GGUF weight differs from the float one; kept float", path)
            continue
        before += linear.weight.numel() * linear.weight.element_size()
        after += packed.nbytes
        _replace(model, path, BlockLinear(packed, int8_dot))
        swapped += 1
    logger.info(
        "GGUF weights packed (%s): %d linear layers, %.1f MiB float32 -> %.1f MiB blocks",
        "int8-dot" if int8_dot else "exact",
        swapped,
        before / 2**20,
        after / 2**20,
    )
    return swapped


def _check_rows(part_rows: Sequence[int]) -> torch.Tensor:
    """The rows of a fused weight whose packed and float values are compared: each part's
    first and last row and about 64 more spread over the whole. A wrong mapping (a part out
    of place, Q/K rows permuted the wrong way) moves whole rows, so it shows in these; the
    whole weight would cost a dequantization per layer at every start (seconds)."""
    total = sum(part_rows)
    chosen = set(range(0, total, max(1, total // 64)))
    start = 0
    for rows in part_rows:
        chosen |= {start, start + rows - 1}
        start += rows
    return torch.tensor(sorted(chosen), dtype=torch.long)


def _linear_at(model: nn.Module, path: str) -> nn.Linear | None:
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return None
    return module if type(module) is nn.Linear else None


def _replace(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, module)
