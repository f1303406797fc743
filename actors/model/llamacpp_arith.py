"""Switch a model to llama.cpp's float arithmetic (the int8-dot weight path's other half).

``--gguf-weights int8-dot`` takes llama.cpp as its reference. Its products are ggml's already;
this module makes the operations between them ggml's too (``kernels.quant.ggml_arith``):
RMSNorm, RoPE (ggml's angles), SwiGLU and paged attention. It flags the model's modules
(each keeps its torch path for every other weight path) and swaps the RoPE table; the runner
then attends with ``GgmlAttention``. A model outside what those operations cover keeps torch's
arithmetic, with its products still int8-dot.
"""

from __future__ import annotations

import ctypes
import logging

import torch
from torch import nn

from actors.model.config import ModelConfig
from actors.model.layers import Attention, DenseMLP, ForwardContext, RMSNorm
from kernels import quant
from kernels.attention import PagedKVCache
from kernels.quant import BlockLinear, ggml_arith

logger = logging.getLogger("roundgate.model")


def why_not(config: ModelConfig) -> str | None:
    """Why llama.cpp's arithmetic cannot stand in for this model's, or None if it can."""
    if config.mla is not None or config.is_moe:
        return "latent attention and MoE layers are not covered"
    if config.qk_norm or config.attention_bias or config.qkv_bias or config.mlp_bias:
        return "per-head norms and projection biases are not covered"
    if config.rope_scaling.kind != "default" or config.rope_dim != config.head_dim:
        return "only unscaled RoPE over the whole head is covered"
    if config.head_dim not in ggml_arith.HEAD_SIZES:
        return f"head size {config.head_dim} is not one of {ggml_arith.HEAD_SIZES}"
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


class FusedDecoder:
    """Every decoder layer in one ``ggml_arith.decoder`` call (int8-dot weights only): what a
    decode step spends between the products is then C++, not a dozen Python-level operations
    per layer. Built by ``fuse_layers``; ``CausalLM.forward`` calls it instead of the layers."""

    def __init__(self, model: nn.Module, config: ModelConfig, cache: PagedKVCache) -> None:
        self.shape = ggml_arith.DecoderShape(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.intermediate_size,
            config.rms_norm_eps,
        )
        self.page_size = cache.page_size
        self.int8_dot = ctypes.cast(quant.kernel().block_linear_q8, ctypes.c_void_p).value
        rows = []
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            rows.append(
                ggml_arith.LayerWeights(
                    layer.input_layernorm.weight.data_ptr(),
                    *_blocks(attn.qkv_proj),
                    *_blocks(attn.o_proj),
                    layer.post_attention_layernorm.weight.data_ptr(),
                    *_blocks(mlp.gate_up_proj),
                    *_blocks(mlp.down_proj),
                    cache.k[i].data_ptr(),
                    cache.v[i].data_ptr(),
                )
            )
        self.layers = (ggml_arith.LayerWeights * len(rows))(*rows)
        # The tensors behind those pointers stay alive with the model and the cache.
        self._keep = (model, cache)

    def __call__(self, h: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        h = h.contiguous() if h.dtype == torch.float32 else h.float().contiguous()
        return ggml_arith.decoder(
            h, self.layers, self.int8_dot, self.shape, ctx.cos, ctx.sin, ctx.batch, self.page_size
        )


def _blocks(linear: nn.Module) -> tuple[int, int]:
    return linear.weights.data.data_ptr(), linear.weights.format.code


def fuse_layers(model: nn.Module, config: ModelConfig, cache: PagedKVCache) -> bool:
    """Run ``model``'s layers as one ``FusedDecoder`` call when every projection is int8-dot
    blocks and the model already runs llama.cpp's arithmetic; False (unchanged) otherwise."""
    for layer in model.layers:
        projections = (
            getattr(layer.self_attn, "qkv_proj", None),
            getattr(layer.self_attn, "o_proj", None),
            getattr(layer.mlp, "gate_up_proj", None),
            getattr(layer.mlp, "down_proj", None),
        )
        if not all(isinstance(p, BlockLinear) and p.int8_dot for p in projections):
            return False
        if not getattr(layer.self_attn, "llamacpp", False):
            return False
    model.fused = FusedDecoder(model, config, cache)
    return True


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
