"""Triton paged attention for extend rounds: prefill chunks over cached prefixes, causal.

Sequence ``b`` brings ``q_len`` new tokens after ``cached`` tokens already in its pages; new
token ``i`` sits at position ``cached + i`` and sees keys ``0 .. cached + i``.

Tiling (GQA packing): one program per (sequence, KV head, block of ``BLOCK_M`` rows), where
the rows are the (new token, query head of this KV head's group) pairs of the sequence,
token-major: row ``r`` is token ``r // GROUP``, head ``kv_head * GROUP + r % GROUP``. Every
K/V tile a program loads thus serves all ``GROUP`` heads sharing it, and even a one-token
chunk fills ``GROUP`` rows of the ``tl.dot``. The program walks key blocks of ``BLOCK_N``
positions through the page table, only up to its last row's position (causality bounds the
loop, the mask does the rest), keeping a float32 online softmax per row. Head dims are
padded to a power of two and masked. Programs past a sequence's rows loop zero times and
store nothing (sequences with no new tokens are allowed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roundgate.kernels.attention.batch import AttentionBatch
from roundgate.kernels.triton_env import tile_width

BLOCK_M = 16
BLOCK_N = 32


@triton.jit
def _paged_extend_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    page_table_ptr,
    cu_q_ptr,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    block = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    kv_len = tl.load(kv_lens_ptr + seq)
    cached = kv_len - q_len
    num_rows = q_len * GROUP
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    token = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    q_pos = cached + token
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q_offs = (q_start + token)[:, None] * stride_q_tok + head[:, None] * stride_q_head
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + q_offs + dims[None, :], mask=q_mask, other=0.0)
    # Keys this block needs: up to its last valid row's position (none past the rows).
    block_end = tl.minimum(block * BLOCK_M + BLOCK_M, num_rows)
    hi = tl.where(block_end > block * BLOCK_M, cached + (block_end - 1) // GROUP + 1, 0)
    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(0, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < hi
        page = tl.load(
            page_table_ptr + seq * stride_pt_seq + pos // PAGE_SIZE, mask=pos_ok, other=0
        )
        slot = page * PAGE_SIZE + pos % PAGE_SIZE
        kv_offs = slot[:, None] * stride_kv_slot + kv_head * stride_kv_head + dims[None, :]
        kv_mask = pos_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + kv_offs, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        allowed = (pos[None, :] <= q_pos[:, None]) & pos_ok[None, :]
        scores = tl.where(allowed, scores, float("-inf"))
        # Key 0 is in the first block and visible to every row: the max is finite
        # from the first block on, so no row ever computes exp(-inf - -inf).
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        probs = tl.exp(scores - new_max[:, None])
        rescale = tl.exp(running_max - new_max)
        v = tl.load(v_ptr + kv_offs, mask=kv_mask, other=0.0)
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision="ieee")
        denom = denom * rescale + tl.sum(probs, 1)
        running_max = new_max
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    o_offs = (q_start + token)[:, None] * stride_o_tok + head[:, None] * stride_o_head
    tl.store(out_ptr + o_offs + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
) -> torch.Tensor:
    """``q [T, H, D]`` (the batch's new tokens, whose K/V are already in the cache) against
    the paged ``k_cache``/``v_cache`` (``[pages, page_size, H_kv, D]``), causal -> ``[T, H, D]``."""
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[2]
    q = q.contiguous()
    out = torch.empty_like(q)
    group = heads // kv_heads
    num_blocks = -(-batch.max_query_len * group // BLOCK_M)
    if batch.num_tokens == 0:
        return out
    k_flat = k_cache.view(-1, kv_heads, dim)
    v_flat = v_cache.view(-1, kv_heads, dim)
    _paged_extend_kernel[(batch.batch_size, kv_heads, num_blocks)](
        q,
        k_flat,
        v_flat,
        out,
        batch.page_table,
        batch.cu_query_lens,
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
        GROUP=group,
        HEAD_DIM=dim,
        BLOCK_D=tile_width(dim),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
    )
    return out
