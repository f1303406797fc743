"""Multi-head latent attention (DeepSeek-V2/V3) over a cache that holds only the latent.

Per token and layer the cache keeps ``c = norm(kv_a(x))[:kv_lora_rank]`` and the RoPE key
``k_pe`` (``kv_lora_rank + qk_rope_head_dim`` values), never per-head K/V. The attention
backend expands ``c`` through ``kv_b_proj`` for extends and, for decodes, folds the key
up-projection into the query instead (``q_nope @ W_uk`` against ``c``, then ``W_uv`` after
the softmax) — the "absorbed" form, whose cost per cached token no longer scales with heads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from roundgate.actors.model.config import ModelConfig
from roundgate.actors.model.fused_path import FusedKernels
from roundgate.actors.model.layers import (
    ForwardContext,
    RMSNorm,
    fill,
    linear,
    load_linear,
    param,
)
from roundgate.actors.model.rope import apply_rope, deinterleave_rows, yarn_mscale
from roundgate.actors.model.weights import TensorSource

# transformers builds DeepSeek's q_a/kv_a norms with RMSNorm's default eps, not rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def mla_softmax_scale(config: ModelConfig) -> float:
    """``qk_head_dim ** -0.5``, times YaRN's ``mscale(factor, mscale_all_dim) ** 2``."""
    if config.mla is None:
        raise ValueError(f"{config.architecture} has no latent attention")
    scale = config.mla.qk_head_dim**-0.5
    rope = config.rope_scaling
    if rope.kind != "default" and rope.mscale_all_dim:
        scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


class MLAttention(nn.Module):
    """DeepSeek's attention: optional q-LoRA, a shared latent for K/V, decoupled RoPE key."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        mla = config.mla
        if mla is None:
            raise ValueError("MLAttention needs a config with mla set")
        self.mla, self.layer, self.num_heads = mla, layer, config.num_heads
        hidden, heads = config.hidden_size, config.num_heads
        q_out = heads * mla.qk_head_dim
        if mla.q_lora_rank:
            self.q_a_proj = linear(hidden, mla.q_lora_rank, False)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = linear(mla.q_lora_rank, q_out, False)
        else:
            self.q_proj = linear(hidden, q_out, False)
        self.kv_a_proj_with_mqa = linear(hidden, mla.latent_width, False)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = param(heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank)
        self.o_proj = linear(heads * mla.v_head_dim, hidden, False)
        self.scale = mla_softmax_scale(config)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if ctx.fused is not None:
            return self.fused_forward(x, ctx, ctx.fused)
        mla, tokens, heads = self.mla, x.shape[0], self.num_heads
        if mla.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q_nope, q_pe = q.view(tokens, heads, mla.qk_head_dim).split(
            [mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1
        )
        latent, k_pe = self.kv_a_proj_with_mqa(x).split(
            [mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1
        )
        latent = self.kv_a_layernorm(latent)
        q_pe = apply_rope(q_pe, ctx.cos, ctx.sin)
        k_pe = apply_rope(k_pe.unsqueeze(1), ctx.cos, ctx.sin).squeeze(1)
        w_kv = self.kv_b_proj.view(heads, mla.qk_nope_head_dim + mla.v_head_dim, -1)
        w_uk, w_uv = w_kv.split([mla.qk_nope_head_dim, mla.v_head_dim], dim=1)
        out = ctx.attention.forward_latent(
            self.layer,
            q_nope,
            q_pe,
            latent,
            k_pe,
            w_uk,
            w_uv,
            ctx.cache,
            ctx.batch,
            ctx.attention_state,
            self.scale,
        )
        return self.o_proj(out.reshape(tokens, heads * mla.v_head_dim))

    def fused_forward(
        self, x: torch.Tensor, ctx: ForwardContext, kernels: FusedKernels
    ) -> torch.Tensor:
        """``forward`` on the fused path: the latent's norm, both RoPEs and the cache write are
        one launch (``mla_prep``, which rotates the query's RoPE part in place), and the
        backend attends over the cache it already holds (``attend_latent``)."""
        mla, tokens, heads = self.mla, x.shape[0], self.num_heads
        if mla.q_lora_rank:
            norm = self.q_a_layernorm
            q = self.q_b_proj(kernels.rms_norm(self.q_a_proj(x), norm.weight, norm.eps))
        else:
            q = self.q_proj(x)
        q = q.view(tokens, heads, mla.qk_head_dim)
        norm = self.kv_a_layernorm
        kv = self.kv_a_proj_with_mqa(x)
        cache = ctx.cache.k[self.layer]
        kernels.mla_prep(
            q, kv, norm.weight, norm.eps, ctx.cos, ctx.sin, ctx.batch.slot_mapping, cache
        )
        q_nope, q_pe = q.split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        w_kv = self.kv_b_proj.view(heads, mla.qk_nope_head_dim + mla.v_head_dim, -1)
        w_uk, w_uv = w_kv.split([mla.qk_nope_head_dim, mla.v_head_dim], dim=1)
        out = ctx.attention.attend_latent(
            self.layer, q_nope, q_pe, w_uk, w_uv, ctx.cache, ctx.batch, self.scale
        )
        return self.o_proj(out.reshape(tokens, heads * mla.v_head_dim))

    @torch.no_grad()
    def load(self, source: TensorSource, prefix: str) -> None:
        """HF names; interleaved RoPE rows are reordered into halves here, once."""
        mla, heads = self.mla, self.num_heads
        rope = mla.qk_rope_head_dim

        def rope_rows(groups: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
            if not mla.rope_interleave:
                return None
            return lambda weight: deinterleave_rows(weight, rope, groups)

        if mla.q_lora_rank:
            self.q_a_proj = load_linear(self.q_a_proj, source, prefix + "q_a_proj.weight")
            fill(self.q_a_layernorm.weight, source, prefix + "q_a_layernorm.weight")
            name = prefix + "q_b_proj.weight"
            self.q_b_proj = load_linear(self.q_b_proj, source, name, reorder=rope_rows(heads))
        else:
            name = prefix + "q_proj.weight"
            self.q_proj = load_linear(self.q_proj, source, name, reorder=rope_rows(heads))
        name = prefix + "kv_a_proj_with_mqa.weight"
        self.kv_a_proj_with_mqa = load_linear(
            self.kv_a_proj_with_mqa, source, name, reorder=rope_rows(1)
        )
        fill(self.kv_a_layernorm.weight, source, prefix + "kv_a_layernorm.weight")
        # Dequantized even when the rest stays FP8: the attention kernels fold its per-head
        # slices into the query and the output (the absorbed form), in the runtime dtype.
        fill(self.kv_b_proj, source, prefix + "kv_b_proj.weight")
        self.o_proj = load_linear(self.o_proj, source, prefix + "o_proj.weight")
