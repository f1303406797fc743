"""The building blocks of the decoder: RMSNorm, RoPE, paged GQA attention, SwiGLU, sparse MoE.

Parameters are allocated uninitialised (``torch.empty``): weights always come from a
loader, so paying for a default init would only slow start-up. Q/K/V and gate/up are
stored fused (one GEMM each) and split back out of HF checkpoints by the loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from actors.model.config import ModelConfig
from kernels.attention import AttentionBackend, AttentionBatch, PagedKVCache
from kernels.moe import MoEBackend, run_experts


@dataclass
class ForwardContext:
    """What one forward shares across layers: the batch, its backends and their state."""

    attention: AttentionBackend
    attention_state: Any
    batch: AttentionBatch
    cache: PagedKVCache
    moe: MoEBackend | None
    # DeepEP legs for this round (from the gathered rows; identical on every rank).
    low_latency: bool
    # [T, 1, D] RoPE tables at each token's position (see ``RotaryTable.lookup``).
    cos: torch.Tensor
    sin: torch.Tensor


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def _linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """An ``nn.Linear`` without its default init (the loader overwrites every weight)."""
    layer = torch.nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias)
    return layer.requires_grad_(False)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 then cast back, the way transformers' Llama does it."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = _param(size)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class RotaryTable(nn.Module):
    """Precomputed cos/sin for every position up to ``max_position`` (non-interleaved RoPE)."""

    def __init__(self, head_dim: int, max_position: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """``[T, 1, D]`` tables for ``apply_rope`` at ``positions``: ``cat(cos, cos)`` and
        the sign-folded ``cat(-sin, sin)``, built once per forward for every layer."""
        cos, sin = self.cos[positions], self.sin[positions]
        return (
            torch.cat((cos, cos), dim=-1).unsqueeze(1).to(dtype),
            torch.cat((-sin, sin), dim=-1).unsqueeze(1).to(dtype),
        )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves: ``x * cos + cat(x2, x1) * cat(-sin, sin)``, which is bit-for-bit
    transformers' ``x * cos + rotate_half(x) * sin`` (negating a factor is exact)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((x2, x1), dim=-1) * signed_sin


class Attention(nn.Module):
    """GQA self-attention over the paged KV cache (the backend does the paged part)."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        qkv = config.q_size + 2 * config.kv_size
        self.qkv_proj = _linear(config.hidden_size, qkv, config.attention_bias)
        self.o_proj = _linear(config.q_size, config.hidden_size, config.attention_bias)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        tokens = x.shape[0]
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(tokens, heads + 2 * kv_heads, self.head_dim)
        # RoPE once over q and k together; v passes through untouched.
        qk = apply_rope(qkv[:, : heads + kv_heads], ctx.cos, ctx.sin)
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
        out = ctx.attention.forward(
            self.layer, q, k, v, ctx.cache, ctx.batch, ctx.attention_state, self.scale
        )
        return self.o_proj(out.reshape(tokens, heads * self.head_dim))


class DenseMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with gate and up fused."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = _linear(config.hidden_size, 2 * inter, config.mlp_bias)
        self.down_proj = _linear(inter, config.hidden_size, config.mlp_bias)

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class SparseMoE(nn.Module):
    """Mixtral's block: softmax router, top-k, renormalised weights, SwiGLU experts.

    Holds only this rank's experts (``w13``/``w2`` stacked by local expert); the backend in
    the context moves tokens to whichever rank holds their experts and back.
    """

    def __init__(self, config: ModelConfig, num_local_experts: int) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.moe_intermediate_size
        self.top_k = config.top_k
        self.gate = _linear(hidden, config.num_experts, bias=False)
        self.w13 = _param(num_local_experts, 2 * inter, hidden)  # gate (w1) then up (w3)
        self.w2 = _param(num_local_experts, hidden, inter)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(topk_weights, topk_ids)``: softmax in float32, top-k, renormalised to sum 1."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        return weights / weights.sum(dim=-1, keepdim=True), ids

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        return self.run(x, ctx.moe if ctx else None, ctx.low_latency if ctx else False)

    def run(self, x: torch.Tensor, moe: MoEBackend | None, low_latency: bool) -> torch.Tensor:
        if moe is None:
            raise ValueError("a MoE layer needs an MoE backend in the forward context")
        weights, ids = self.route(x)
        dispatched = moe.dispatch(x, ids, weights, low_latency=low_latency)
        out = run_experts(dispatched.hidden, dispatched.counts, self.w13, self.w2)
        return moe.combine(out, dispatched)
