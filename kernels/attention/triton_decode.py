"""Triton paged attention for decode rounds (one query token per sequence).

Tiling: one program per (sequence, query head). It loads its query row once, walks the
sequence's keys in blocks of ``BLOCK_N`` positions, looks each key's slot up through the
page table (so pages may be anywhere and any size: no padded K/V copy is made) and keeps an
online softmax (running max, denominator, ``[BLOCK_D]`` accumulator) in float32. The head
dimension is padded to a power of two and masked, so odd head dims work. Query head ``h``
reads KV head ``h // GROUP`` (GQA). Scores are row-times-block products, not ``tl.dot``: a
decode has one query row, below the 16-row minimum of a tensor-core tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roundgate.kernels.attention.batch import AttentionBatch
from roundgate.kernels.triton_env import tile_width

BLOCK_N = 64


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    page_table_ptr,
    kv_lens_ptr,
    scale,
    stride_q_tok,
    stride_q_head,
    stride_kv_slot,
    stride_kv_head,
    stride_o_tok,
    stride_o_head,
    stride_pt_seq,
    PAGE_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    kv_len = tl.load(kv_lens_ptr + seq)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_q_tok + head * stride_q_head + dims, mask=dim_ok, other=0.0)
    q = q.to(tl.float32)
    running_max = tl.full([], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < kv_len
        page = tl.load(
            page_table_ptr + seq * stride_pt_seq + pos // PAGE_SIZE, mask=pos_ok, other=0
        )
        slot = page * PAGE_SIZE + pos % PAGE_SIZE
        offs = slot[:, None] * stride_kv_slot + kv_head * stride_kv_head + dims[None, :]
        ok = pos_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        scores = tl.sum(k * q[None, :], 1) * scale
        scores = tl.where(pos_ok, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 0))
        probs = tl.exp(scores - new_max)
        rescale = tl.exp(running_max - new_max)
        v = tl.load(v_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        acc = acc * rescale + tl.sum(probs[:, None] * v, 0)
        denom = denom * rescale + tl.sum(probs, 0)
        running_max = new_max
    out = acc / denom
    out_offs = seq * stride_o_tok + head * stride_o_head + dims
    tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=dim_ok)


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
) -> torch.Tensor:
    """``q [B, H, D]`` (one token per sequence, already written to the cache) against the
    paged ``k_cache``/``v_cache`` (``[pages, page_size, H_kv, D]``) -> ``[B, H, D]``."""
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[2]
    if batch.num_tokens != batch.batch_size:
        raise ValueError("paged_decode takes exactly one query token per sequence")
    q = q.contiguous()
    out = torch.empty_like(q)
    if batch.batch_size == 0:
        return out
    k_flat = k_cache.view(-1, kv_heads, dim)
    v_flat = v_cache.view(-1, kv_heads, dim)
    _paged_decode_kernel[(batch.batch_size, heads)](
        q,
        k_flat,
        v_flat,
        out,
        batch.page_table,
        batch.kv_lens,
        scale,
        q.stride(0),
        q.stride(1),
        k_flat.stride(0),
        k_flat.stride(1),
        out.stride(0),
        out.stride(1),
        batch.page_table.stride(0),
        PAGE_SIZE=batch.page_size,
        GROUP=heads // kv_heads,
        HEAD_DIM=dim,
        BLOCK_D=tile_width(dim),
        BLOCK_N=BLOCK_N,
    )
    return out
