"""The building blocks of the decoder: RMSNorm, paged GQA attention, SwiGLU, and the
``ForwardContext`` every layer reads. Latent attention lives in ``mla.py``, MoE in ``moe.py``.

Parameters are allocated uninitialised (``torch.empty``): weights always come from a
loader, so paying for a default init would only slow start-up. Q/K/V and gate/up are
stored fused (one GEMM each) and split back out of HF checkpoints by each module's ``load``,
which reads HF names under a prefix through a ``TensorSource``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from roundgate.actors.model.config import ModelConfig
from roundgate.actors.model.fp8 import kept_fp8
from roundgate.actors.model.fused_path import FusedKernels
from roundgate.actors.model.rope import RotaryTable, apply_rope
from roundgate.actors.model.weights import TensorSource
from roundgate.kernels.attention.base import AttentionBackend
from roundgate.kernels.attention.batch import AttentionBatch, PagedKVCache
from roundgate.kernels.moe.base import ExpertsKernel, MoEBackend, run_experts
from roundgate.kernels.moe.expert_load import ExpertLoad
from roundgate.kernels.quant import ggml_arith
from roundgate.kernels.quant.fp8_blocks import BLOCK as FP8_BLOCK
from roundgate.kernels.quant.fp8_linear import Fp8Linear

__all__ = ["Attention", "DenseMLP", "ForwardContext", "RMSNorm", "RotaryTable", "apply_rope"]


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
    # The expert computation between dispatch and combine (``--moe-kernel``).
    experts: ExpertsKernel = run_experts
    # --enable-eplb: where the MoE layers count the tokens they route (None: not counted).
    expert_load: ExpertLoad | None = None
    # The fused decode path's kernels (``fused_path.FusedKernels``; None: the reference ops):
    # a norm, the MLA preamble, the router and an activation each one launch.
    fused: FusedKernels | None = None
    # Experts through the device-only fused MoE (``kernels/moe/triton_fused_moe``): this rank
    # holds every expert its tokens chose, so no dispatch, and no host read of expert counts.
    fused_moe: bool = False


def param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """An ``nn.Linear`` without its default init (the loader overwrites every weight)."""
    layer = torch.nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias)
    return layer.requires_grad_(False)


def fill(
    target: torch.Tensor, source: TensorSource, *names: str, rows: tuple[int, ...] = ()
) -> None:
    """Copy the HF tensors ``names``, concatenated along dim 0, into ``target``.

    Each part has ``target``'s trailing shape and ``rows`` rows (default: an equal split), so
    ``source.get`` checks every tensor's shape and a mismatched file names the one at fault.
    """
    counts = rows or (target.shape[0] // len(names),) * len(names)
    parts = [source.get(n, (r, *target.shape[1:])) for n, r in zip(names, counts, strict=True)]
    target.copy_(parts[0] if len(parts) == 1 else torch.cat(parts))


def load_linear(
    layer: nn.Linear | Fp8Linear,
    source: TensorSource,
    *names: str,
    rows: tuple[int, ...] = (),
    reorder: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> nn.Linear | Fp8Linear:
    """``layer``'s weight read from the HF tensors ``names`` (stacked along dim 0 as ``fill``
    stacks them; ``reorder`` then permutes its rows), or in its place an ``Fp8Linear`` holding
    them as stored, when the source keeps FP8 (``--fp8-weights``) and that is exact.

    Exact means: the layer has no bias, every part is stored FP8, each part but the last is a
    whole number of 128-row blocks (so the parts' scale rows stack as their rows do; DeepSeek's
    widths all are) and ``reorder`` moves rows only within their block. Otherwise the weight is
    dequantized into ``layer`` as before. The caller puts the returned module in place.
    """
    width = layer.in_features
    counts = rows or (layer.out_features // len(names),) * len(names)
    if layer.bias is None and getattr(source, "keep_fp8", False):
        parts = [kept_fp8(source, n, (r, width)) for n, r in zip(names, counts, strict=True)]
        stacked = all(r % FP8_BLOCK == 0 for r in counts[:-1])
        if stacked and all(p is not None for p in parts):
            codes = torch.cat([p.codes.view(torch.uint8) for p in parts if p is not None])
            scales = torch.cat([p.scale_inv for p in parts if p is not None])
            order = torch.arange(codes.shape[0])
            if reorder is not None:
                order = reorder(order.unsqueeze(1)).squeeze(1)
            if torch.equal(order // FP8_BLOCK, torch.arange(codes.shape[0]) // FP8_BLOCK):
                weight = codes.index_select(0, order).view(torch.float8_e4m3fn)
                return Fp8Linear(weight.contiguous(), scales.contiguous())
    if not isinstance(layer, nn.Linear):
        raise ValueError(f"{names[0]}: an FP8 layer cannot be reloaded from float weights")
    parts = [source.get(n, (r, width)) for n, r in zip(names, counts, strict=True)]
    weight = parts[0] if len(parts) == 1 else torch.cat(parts)
    layer.weight.copy_(weight if reorder is None else reorder(weight))
    return layer


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 then cast back, the way transformers' Llama does it."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = param(size)
        self.eps = eps
        # llama.cpp's arithmetic (``llamacpp_arith``: the int8-dot weight path).
        self.llamacpp = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.llamacpp:
            return ggml_arith.rms_norm(x, self.weight, self.eps)
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class Attention(nn.Module):
    """GQA self-attention over the paged KV cache (the backend does the paged part).

    Optional per family: biases on q/k/v (Qwen2) or on all four projections (Llama's
    ``attention_bias``), and Qwen3's per-head RMSNorm of q and k ahead of RoPE.
    """

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        qkv = config.q_size + 2 * config.kv_size
        self.qkv_proj = linear(config.hidden_size, qkv, config.attention_bias or config.qkv_bias)
        self.o_proj = linear(config.q_size, config.hidden_size, config.attention_bias)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        # ggml's RoPE (the tables in ``ctx`` are then ggml's too; see ``llamacpp_arith``).
        self.llamacpp = False

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        tokens = x.shape[0]
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(tokens, heads + 2 * kv_heads, self.head_dim)
        qk, v = qkv[:, : heads + kv_heads], qkv[:, heads + kv_heads :]
        if self.q_norm is not None and self.k_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :heads]), self.k_norm(qk[:, heads:])), dim=1)
        # RoPE once over q and k together; v passes through untouched.
        if self.llamacpp:
            qk = ggml_arith.rope_(qk, ctx.cos, ctx.sin)
        else:
            qk = apply_rope(qk, ctx.cos, ctx.sin)
        q, k = qk[:, :heads], qk[:, heads:]
        out = ctx.attention.forward(
            self.layer, q, k, v, ctx.cache, ctx.batch, ctx.attention_state, self.scale
        )
        return self.o_proj(out.reshape(tokens, heads * self.head_dim))

    def load(self, source: TensorSource, prefix: str) -> None:
        names = [f"{prefix}{n}_proj." for n in ("q", "k", "v")]
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        weights = (n + "weight" for n in names)
        self.qkv_proj = load_linear(self.qkv_proj, source, *weights, rows=(q, kv, kv))
        if self.qkv_proj.bias is not None:
            fill(self.qkv_proj.bias, source, *(n + "bias" for n in names), rows=(q, kv, kv))
        self.o_proj = load_linear(self.o_proj, source, prefix + "o_proj.weight")
        if self.o_proj.bias is not None:
            fill(self.o_proj.bias, source, prefix + "o_proj.bias")
        if self.q_norm is not None and self.k_norm is not None:
            fill(self.q_norm.weight, source, prefix + "q_norm.weight")
            fill(self.k_norm.weight, source, prefix + "k_norm.weight")


class DenseMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with gate and up fused."""

    def __init__(self, hidden: int, inter: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = linear(hidden, 2 * inter, bias)
        self.down_proj = linear(inter, hidden, bias)
        self.llamacpp = False  # ggml's SwiGLU (``llamacpp_arith``)

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        if self.llamacpp:
            return self.down_proj(ggml_arith.swiglu(self.gate_up_proj(x)))
        if ctx is not None and ctx.fused is not None:
            return self.down_proj(ctx.fused.silu_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def load(self, source: TensorSource, prefix: str) -> None:
        gate_up = (f"{prefix}gate_proj.weight", f"{prefix}up_proj.weight")
        self.gate_up_proj = load_linear(self.gate_up_proj, source, *gate_up)
        self.down_proj = load_linear(self.down_proj, source, f"{prefix}down_proj.weight")
        if self.down_proj.bias is not None:
            fill(self.gate_up_proj.bias, source, f"{prefix}gate_proj.bias", f"{prefix}up_proj.bias")
            fill(self.down_proj.bias, source, f"{prefix}down_proj.bias")
