"""Triton latent attention (MLA) in the absorbed form, for decode and extend rounds.

The cache holds one ``[latent | k_pe]`` entry per token (``kv_lora_rank + qk_rope_head_dim``
wide, see ``batch.py``). The caller absorbs ``W_uk`` into the query (``q_lat = q_nope @ W_uk``,
``[T, H, r]``) and applies ``W_uv`` after the kernel; the kernel attends every (token, head)
query ``[q_lat | q_pe]`` to the cached entries as one-KV-head MQA with the latent as the
value: ``softmax(scale * (q_lat . latent + q_pe . k_pe)) @ latent``, causal within the
sequence (new token ``i`` at position ``cached + i``). Per-head K/V are never built.

Tiling: one program per (sequence, block of ``BLOCK_M`` rows), the rows being the
sequence's (new token, head) pairs token-major (row ``r``: token ``r // HEADS``, head
``r % HEADS``). A decode's heads fill the rows of the ``tl.dot`` (the point of absorbing:
one latent tile serves every head), and an extend chunk's tokens simply add rows. Each
program walks key blocks of ``BLOCK_N`` positions through the page table, up to its last
row's position, loading the latent tile ``[BLOCK_N, BLOCK_R]`` (used as key and value) and
the RoPE tile ``[BLOCK_N, BLOCK_P]``, with a float32 online softmax and a ``[BLOCK_M,
BLOCK_R]`` accumulator. Both widths are padded to powers of two and masked.
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
def _mla_absorbed_kernel(
    q_lat_ptr,
    q_pe_ptr,
    cache_ptr,
    out_ptr,
    page_table_ptr,
    cu_q_ptr,
    kv_lens_ptr,
    scale,
    stride_ql_tok,
    stride_ql_head,
    stride_qp_tok,
    stride_qp_head,
    stride_c_slot,
    stride_o_tok,
    stride_o_head,
    stride_pt_seq,
    PAGE_SIZE: tl.constexpr,
    HEADS: tl.constexpr,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    seq = tl.program_id(0)
    block = tl.program_id(1)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    kv_len = tl.load(kv_lens_ptr + seq)
    cached = kv_len - q_len
    num_rows = q_len * HEADS
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    token = q_start + rows // HEADS
    head = rows % HEADS
    q_pos = cached + rows // HEADS
    lat = tl.arange(0, BLOCK_R)
    lat_ok = lat < RANK
    rope = tl.arange(0, BLOCK_P)
    rope_ok = rope < ROPE
    ql_offs = token[:, None] * stride_ql_tok + head[:, None] * stride_ql_head + lat[None, :]
    q_lat = tl.load(q_lat_ptr + ql_offs, mask=row_ok[:, None] & lat_ok[None, :], other=0.0)
    qp_offs = token[:, None] * stride_qp_tok + head[:, None] * stride_qp_head + rope[None, :]
    q_pe = tl.load(q_pe_ptr + qp_offs, mask=row_ok[:, None] & rope_ok[None, :], other=0.0)
    block_end = tl.minimum(block * BLOCK_M + BLOCK_M, num_rows)
    hi = tl.where(block_end > block * BLOCK_M, cached + (block_end - 1) // HEADS + 1, 0)
    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for start in range(0, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < hi
        page = tl.load(
            page_table_ptr + seq * stride_pt_seq + pos // PAGE_SIZE, mask=pos_ok, other=0
        )
        slot = (page * PAGE_SIZE + pos % PAGE_SIZE)[:, None] * stride_c_slot
        latent = tl.load(
            cache_ptr + slot + lat[None, :], mask=pos_ok[:, None] & lat_ok[None, :], other=0.0
        )
        k_pe = tl.load(
            cache_ptr + slot + RANK + rope[None, :],
            mask=pos_ok[:, None] & rope_ok[None, :],
            other=0.0,
        )
        scores = tl.dot(q_lat, tl.trans(latent), input_precision="ieee")
        scores += tl.dot(q_pe, tl.trans(k_pe), input_precision="ieee")
        scores = scores * scale
        allowed = (pos[None, :] <= q_pos[:, None]) & pos_ok[None, :]
        scores = tl.where(allowed, scores, float("-inf"))
        # Key 0 lies in the first block and every row sees it: the max is finite from
        # the first block on.
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        probs = tl.exp(scores - new_max[:, None])
        rescale = tl.exp(running_max - new_max)
        acc = acc * rescale[:, None] + tl.dot(
            probs.to(latent.dtype), latent, input_precision="ieee"
        )
        denom = denom * rescale + tl.sum(probs, 1)
        running_max = new_max
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    o_offs = token[:, None] * stride_o_tok + head[:, None] * stride_o_head + lat[None, :]
    tl.store(
        out_ptr + o_offs,
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & lat_ok[None, :],
    )


def mla_absorbed(
    q_lat: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
) -> torch.Tensor:
    """``q_lat [T, H, r]`` and ``q_pe [T, H, dr]`` against the latent ``cache``
    (``[pages, page_size, 1, r + dr]``, the new tokens already written) -> ``[T, H, r]``."""
    tokens, heads, rank = q_lat.shape
    rope = q_pe.shape[-1]
    q_lat, q_pe = q_lat.contiguous(), q_pe.contiguous()
    out = q_lat.new_empty(tokens, heads, rank)
    if tokens == 0:
        return out
    flat = cache.view(-1, cache.shape[-1])
    num_blocks = -(-batch.max_query_len * heads // BLOCK_M)
    _mla_absorbed_kernel[(batch.batch_size, num_blocks)](
        q_lat,
        q_pe,
        flat,
        out,
        batch.page_table,
        batch.cu_query_lens,
        batch.kv_lens,
        scale,
        q_lat.stride(0),
        q_lat.stride(1),
        q_pe.stride(0),
        q_pe.stride(1),
        flat.stride(0),
        out.stride(0),
        out.stride(1),
        batch.page_table.stride(0),
        PAGE_SIZE=batch.page_size,
        HEADS=heads,
        RANK=rank,
        ROPE=rope,
        BLOCK_R=tile_width(rank),
        BLOCK_P=tile_width(rope),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
    )
    return out
