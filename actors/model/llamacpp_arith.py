"""Switch a model to llama.cpp's float arithmetic (the int8-dot weight path's other half).

``--gguf-weights int8-dot`` takes llama.cpp as its reference. Its products are ggml's already;
this module makes the operations between them ggml's too (``kernels.quant.ggml_arith``):
RMSNorm, RoPE (ggml's angles), SwiGLU and paged attention. It flags the model's modules
(each keeps its torch path for every other weight path) and swaps the RoPE table; the runner
then attends with ``GgmlAttention``. A model outside what those operations cover keeps torch's
arithmetic, with its products still int8-dot.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from actors.model.config import ModelConfig
from actors.model.layers import Attention, DenseMLP, RMSNorm
from kernels.quant import ggml_arith

logger = logging.getLogger("roundgate.model")


def why_not(config: ModelConfig) -> str | None:
    """Why llama.cpp's arithmetic cannot stand in for this model's, or None if it can."""
    if config.mla is not None or config.is_moe:
        return "latent attention and MoE layers are not covered"
    if config.qk_norm or config.attention_bias or config.qkv_bias or config.mlp_bias:
        return "per-head norms and projection biases are not covered"
    if config.rope_scaling.kind != "default" or config.rope_dim != config.head_dim:
        return "only unscaled RoPE over the whole head is covered"
    if config.head_dim % 32:
        return f"head size {config.head_dim}: ggml's dot products sum 32 at a time"
    return None


class GgmlRotaryTable(nn.Module):
    """ggml's RoPE angles in place of a ``RotaryTable``: its ``lookup`` gives ``[T, D / 2]``
    cos and sin, what ``ggml_arith.rope_`` reads (``RotaryTable`` folds them for torch)."""

    def __init__(self, head_dim: int, max_position: int, theta: float) -> None:
        super().__init__()
        cos, sin = ggml_arith.rope_table(max_position, head_dim, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        return self.cos[positions], self.sin[positions]


def use_llamacpp_arithmetic(model: nn.Module, config: ModelConfig) -> bool:
    """Flag ``model``'s norms, attention and MLPs to run ggml's arithmetic; False (nothing
    changed, with a log line saying why) where the model is not covered."""
    reason = why_not(config)
    if reason is not None:
        logger.warning("int8-dot: torch's float operations kept (%s)", reason)
        return False
    for module in model.modules():
        if isinstance(module, (RMSNorm, Attention, DenseMLP)):
            module.llamacpp = True
    model.rotary = GgmlRotaryTable(config.head_dim, config.max_position, config.rope_theta)
    return True
