"""Switch a model to llama.cpp's float arithmetic (the int8-dot weight path's other half).

``--gguf-weights int8-dot`` takes llama.cpp as its reference. Its products are ggml's already;
this module makes the operations between them ggml's too (``roundgate.kernels.quant.ggml_arith``):
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

from roundgate.actors.model.config import ModelConfig
from roundgate.actors.model.layers import Attention, DenseMLP, ForwardContext, RMSNorm
from roundgate.kernels import quant
from roundgate.kernels.attention.batch import PagedKVCache
from roundgate.kernels.quant import BlockLinear, ggml_arith

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
    """Every decoder layer in one ``ggml_arith.decoder`` call: what a decode step spends between
    the products is then C++, not a dozen Python-level operations per layer.

    Two products, one per packed weight path:
    - int8-dot: llama.cpp's model, every batch (its attention, ``GgmlAttention``, caches K in
      the file's order);
    - exact: the float32 products of the dequantized weights, for batches of at most
      ``quant.GEMM_ROWS`` tokens (decode rounds); a longer prefill runs the layers one by one,
      where the dequantized-weight GEMM is faster. Both share ``TorchAttention``'s cache
      layout, and both are float32 throughout: only last bits differ between them (ggml's
      double-summed RMSNorm and vectorised exp against torch's), as summation orders do.

    Built by ``fuse_layers``; ``CausalLM.forward`` calls it for the batches it ``takes``.
    """

    def __init__(
        self, model: nn.Module, config: ModelConfig, cache: PagedKVCache, int8_dot: bool
    ) -> None:
        self.shape = ggml_arith.DecoderShape(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.intermediate_size,
            config.rms_norm_eps,
        )
        self.page_size = cache.page_size
        self.int8_dot = int8_dot
        self.max_tokens = None if int8_dot else quant.GEMM_ROWS
        lib = quant.kernel()
        product = lib.block_linear_q8 if int8_dot else lib.block_linear_f32
        self.product = ctypes.cast(product, ctypes.c_void_p).value
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

    def takes(self, tokens: int) -> bool:
        return self.max_tokens is None or tokens <= self.max_tokens

    def __call__(self, h: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        h = h.contiguous() if h.dtype == torch.float32 else h.float().contiguous()
        cos, sin = ctx.cos, ctx.sin
        if cos.dim() == 3:  # a RotaryTable's [T, 1, D] cat(cos, cos) and cat(-sin, sin)
            half = cos.shape[-1] // 2
            cos, sin = cos[:, 0, :half], sin[:, 0, half:]
        return ggml_arith.decoder(
            h,
            self.layers,
            self.product,
            self.shape,
            cos,
            sin,
            ctx.batch,
            self.page_size,
            file_order=self.int8_dot,
        )


def _blocks(linear: nn.Module) -> tuple[int, int]:
    return linear.weights.data.data_ptr(), linear.weights.format.code


def fuse_layers(model: nn.Module, config: ModelConfig, cache: PagedKVCache) -> bool:
    """Run ``model``'s layers as one ``FusedDecoder`` call when the model is covered
    (``why_not``) and every projection is packed blocks of one product (int8-dot layers must
    also run llama.cpp's arithmetic: ``use_llamacpp_arithmetic``); False, unchanged, otherwise."""
    if why_not(config) is not None:
        return False
    reason = ggml_arith.unavailable()
    if reason is not None:
        logger.warning("decoder layers run one by one (%s)", reason)
        return False
    projections = [
        getattr(part, name, None)
        for layer in model.layers
        for part, name in (
            (layer.self_attn, "qkv_proj"),
            (layer.self_attn, "o_proj"),
            (layer.mlp, "gate_up_proj"),
            (layer.mlp, "down_proj"),
        )
    ]
    if not all(isinstance(p, BlockLinear) for p in projections):
        return False
    products = {p.int8_dot for p in projections}
    if len(products) != 1:
        return False
    int8_dot = products.pop()
    if int8_dot and not all(getattr(layer.self_attn, "llamacpp", False) for layer in model.layers):
        return False
    model.fused = FusedDecoder(model, config, cache, int8_dot)
    return True


def use_llamacpp_arithmetic(model: nn.Module, config: ModelConfig) -> bool:
    """Flag ``model``'s norms, attention and MLPs to run ggml's arithmetic; False (nothing
    changed, with a log line saying why) where the model is not covered."""
    reason = why_not(config) or ggml_arith.unavailable()
    if reason is not None:
        logger.warning("int8-dot: torch's float operations kept (%s)", reason)
        return False
    for module in model.modules():
        if isinstance(module, (RMSNorm, Attention, DenseMLP)):
            module.llamacpp = True
    model.rotary = GgmlRotaryTable(config.head_dim, config.max_position, config.rope_theta)
    return True
