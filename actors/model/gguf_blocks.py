"""GGUF linear weights kept block-quantized (``--gguf-weights packed``).

The loader fills every layer with dequantized float32 weights first (one path for every
source). Then, for a GGUF model on the CPU, each linear layer whose checkpoint tensors are
Q4_1 or Q8_0 is swapped for a ``BlockLinear`` over the file's own blocks, read again from the
memory-mapped file (fused projections concatenate their parts' rows, Q/K rows un-permuted as
the float path does). A swap happens only when the packed weight dequantizes to exactly the
float32 weight it replaces, so a mapping that does not fit a model can never change results.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from actors.model.gguf_source import GGUFSource, unpermute
from kernels.quant import BLOCK, BlockLinear, BlockWeights, kernel, kernel_failure

logger = logging.getLogger("roundgate.model")

# The decoder's fused linear layers and the checkpoint tensors they hold, in row order.
_LAYER_LINEARS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}


def read_blocks(source: GGUFSource, name: str) -> BlockWeights | None:
    """The HF tensor ``name`` as blocks, if the file stores it as Q4_1 or Q8_0."""
    import gguf

    tensor = source.tensor_of(name)
    if tensor is None:
        return None
    kind = tensor.tensor_type
    raw = np.asarray(tensor.data, dtype=np.uint8)
    rows = raw.shape[0]
    if kind == gguf.GGMLQuantizationType.Q4_1:
        blocks = raw.reshape(rows, -1, 20)  # f16 scale, f16 min, 16 bytes of nibbles
        scale = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        offset = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        packed = blocks[..., 4:]
        q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).astype(np.int8)
    elif kind == gguf.GGMLQuantizationType.Q8_0:
        blocks = raw.reshape(rows, -1, 34)  # f16 scale, 32 int8
        scale = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        offset = None
        q = blocks[..., 2:].copy().view(np.int8)
    else:
        return None
    q = q.reshape(rows, -1)
    heads = source.permuted_heads(tensor.name)
    arrays = [q, scale] + ([] if offset is None else [offset])
    if heads is not None:
        arrays = [unpermute(a, heads) for a in arrays]
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    return BlockWeights(tensors[0], tensors[1], tensors[2] if offset is not None else None)


def pack_gguf(model: nn.Module, source: object, tied: bool) -> int:
    """Swap the model's linear layers for packed ones where the file allows; returns how many
    (0 for a source that is not a GGUF file).

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
        if not torch.equal(packed.dequantize(), linear.weight.float()):
            logger.warning("%s: packed GGUF weight differs from the float one; kept float", path)
            continue
        before += linear.weight.numel() * linear.weight.element_size()
        after += packed.nbytes
        _replace(model, path, BlockLinear(packed))
        swapped += 1
    logger.info(
        "GGUF weights packed: %d linear layers, %.1f MiB float32 -> %.1f MiB blocks",
        swapped,
        before / 2**20,
        after / 2**20,
    )
    return swapped


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
