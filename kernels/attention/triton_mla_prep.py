"""MLA's step between the projections and the attention kernel, in one Triton launch.

``MLAttention.forward`` (``actors/model/mla.py``) turns the projections' outputs into what
the absorbed attention reads: the latent through ``kv_a_layernorm``, RoPE on the query's
rope part and on the shared ``k_pe``, and ``[latent | k_pe]`` written to the token's cache
slot (``PagedKVCache.write_latent``). In torch that is a norm (four ops), two RoPEs (about
six ops each: the chunk, the cat, two multiplies, an add, the views), a cat and an
``index_copy_``, some twenty dispatches per layer. Here it is one launch.

Grid: (token, block of ``BLOCK_H`` heads). Every program rotates its heads' query rope
columns in place; the programs of head block 0 also normalise the token's latent, rotate its
``k_pe`` and store both in the token's cache row. The rotation works on halves (``x1``, ``x2``:
``apply_rope``'s non-interleaved layout): the first half becomes ``x1 * cos + x2 * sin`` and
the second ``x2 * cos + x1 * sin`` (``sin`` the sign-folded table of ``RotaryTable.lookup``),
so each thread writes only the columns it has itself read, which makes the in-place update
safe without a barrier.

Arithmetic is torch's, rounding included: each product and the sum rounded to the tensor's
dtype, and the launch compiled without FMA contraction (``enable_fp_fusion=False``), which
would otherwise fuse ``x * cos + r * sin`` into one rounding and drift from the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roundgate.kernels.triton_env import tile_width

# Heads a program rotates: 128 heads of rope 64 make 8 programs a token of [16, 32] halves.
MAX_BLOCK_H = 16


@triton.jit
def _rotate(x, partner, cos, signed_sin):
    """``x * cos + partner * signed_sin``, each step rounded to ``x``'s dtype as torch does."""
    dtype = x.dtype
    a = (x.to(tl.float32) * cos.to(tl.float32)).to(dtype)
    b = (partner.to(tl.float32) * signed_sin.to(tl.float32)).to(dtype)
    return (a.to(tl.float32) + b.to(tl.float32)).to(dtype)


@triton.jit
def _mla_prep_kernel(
    q_ptr,
    kv_ptr,
    weight_ptr,
    cos_ptr,
    sin_ptr,
    slots_ptr,
    cache_ptr,
    eps,
    stride_q_tok,
    stride_q_head,
    stride_kv_tok,
    stride_cos_tok,
    stride_sin_tok,
    stride_c_page,
    stride_c_slot,
    HEADS: tl.constexpr,
    NOPE: tl.constexpr,
    RANK: tl.constexpr,
    HALF: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    half = tl.arange(0, BLOCK_HALF)
    half_ok = half < HALF
    cos_row = cos_ptr + tok * stride_cos_tok
    sin_row = sin_ptr + tok * stride_sin_tok
    cos1 = tl.load(cos_row + half, mask=half_ok, other=0.0)
    cos2 = tl.load(cos_row + HALF + half, mask=half_ok, other=0.0)
    sin1 = tl.load(sin_row + half, mask=half_ok, other=0.0)
    sin2 = tl.load(sin_row + HALF + half, mask=half_ok, other=0.0)

    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    q_mask = (heads < HEADS)[:, None] & half_ok[None, :]
    q_first = q_ptr + tok * stride_q_tok + heads[:, None] * stride_q_head + NOPE + half[None, :]
    q1 = tl.load(q_first, mask=q_mask, other=0.0)
    q2 = tl.load(q_first + HALF, mask=q_mask, other=0.0)
    tl.store(q_first, _rotate(q1, q2, cos1[None, :], sin1[None, :]), mask=q_mask)
    tl.store(q_first + HALF, _rotate(q2, q1, cos2[None, :], sin2[None, :]), mask=q_mask)

    if head_block == 0:
        kv_row = kv_ptr + tok * stride_kv_tok
        slot = tl.load(slots_ptr + tok).to(tl.int64)
        cache_row = (
            cache_ptr + (slot // PAGE_SIZE) * stride_c_page + (slot % PAGE_SIZE) * stride_c_slot
        )
        lat = tl.arange(0, BLOCK_R)
        lat_ok = lat < RANK
        latent = tl.load(kv_row + lat, mask=lat_ok, other=0.0)
        xf = latent.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / RANK + eps)
        normed = (xf * rstd).to(latent.dtype)
        weight = tl.load(weight_ptr + lat, mask=lat_ok, other=0.0)
        normed = (normed.to(tl.float32) * weight.to(tl.float32)).to(latent.dtype)
        cache_dtype = cache_ptr.dtype.element_ty
        tl.store(cache_row + lat, normed.to(cache_dtype), mask=lat_ok)
        k1 = tl.load(kv_row + RANK + half, mask=half_ok, other=0.0)
        k2 = tl.load(kv_row + RANK + HALF + half, mask=half_ok, other=0.0)
        k1_out = _rotate(k1, k2, cos1, sin1).to(cache_dtype)
        k2_out = _rotate(k2, k1, cos2, sin2).to(cache_dtype)
        tl.store(cache_row + RANK + half, k1_out, mask=half_ok)
        tl.store(cache_row + RANK + HALF + half, k2_out, mask=half_ok)


def _require_rows(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must be {list(shape)}, got {list(t.shape)}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def mla_prep(
    q: torch.Tensor,
    kv: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    slot_mapping: torch.Tensor,
    cache_layer: torch.Tensor,
) -> None:
    """RoPE on ``q [T, H, dn + dr]``'s last ``dr`` columns, in place, and for each token
    ``cache_layer`` (``[pages, page_size, 1, r + dr]``) at ``slot_mapping[t]`` set to
    ``[rms_norm(kv[t, :r]) | rope(kv[t, r:])]``: one launch, nothing else dispatched.

    ``kv [T, r + dr]`` is ``kv_a_proj_with_mqa``'s output, ``cos``/``signed_sin [T, 1, dr]``
    the tables of ``RotaryTable.lookup``. Slots are used as given (the graph's padding rows
    share one scratch slot, whose content is never read). Strided inputs are refused rather
    than copied: ``q`` is updated in place, and a copy would be a dispatch of its own.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [T, H, dn + dr], got {list(q.shape)}")
    tokens, heads, head_dim = q.shape
    rope, rank = cos.shape[-1], norm_weight.shape[0]
    if rope % 2:
        raise ValueError(f"the rope dim must be even, got {rope}")
    _require_rows("q", q, (tokens, heads, head_dim))
    _require_rows("kv", kv, (tokens, rank + rope))
    _require_rows("cos", cos, (tokens, 1, rope))
    _require_rows("signed_sin", signed_sin, (tokens, 1, rope))
    if head_dim < rope or tuple(slot_mapping.shape) != (tokens,):
        raise ValueError(
            f"q's head dim {head_dim} must hold the rope dim {rope}, and slot_mapping "
            f"{list(slot_mapping.shape)} must have {tokens} entries"
        )
    pages, page_size = cache_layer.shape[0], cache_layer.shape[1]
    _require_rows("cache_layer", cache_layer, (pages, page_size, 1, rank + rope))
    if not tokens:
        return
    block_h = min(tile_width(heads, 1), MAX_BLOCK_H)
    grid = (tokens, triton.cdiv(heads, block_h))
    _mla_prep_kernel[grid](
        q,
        kv,
        norm_weight,
        cos,
        signed_sin,
        slot_mapping,
        cache_layer,
        eps,
        q.stride(0),
        q.stride(1),
        kv.stride(0),
        cos.stride(0),
        signed_sin.stride(0),
        cache_layer.stride(0),
        cache_layer.stride(1),
        HEADS=heads,
        NOPE=head_dim - rope,
        RANK=rank,
        HALF=rope // 2,
        PAGE_SIZE=page_size,
        BLOCK_H=block_h,
        BLOCK_R=tile_width(rank, 1),
        BLOCK_HALF=tile_width(rope // 2, 1),
        enable_fp_fusion=False,
    )
