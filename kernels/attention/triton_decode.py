"""A Triton paged-decode kernel (CUDA only; ``triton`` is imported when the backend is built).

Decode rounds are the hot path: one query token per sequence against its paged K/V. One
program per (sequence, query head) walks the sequence's keys in blocks of ``BLOCK_N``,
looks each key's slot up through the page table, and keeps an online softmax, so no
padded K/V copy is ever made. Rounds with an extend fall back to the torch reference
(prefill is compute-bound and rare under the gate; the reference is correct for it).
"""

from __future__ import annotations

from typing import Any

import torch

from kernels.attention.batch import AttentionBatch, PagedKVCache
from kernels.attention.torch_ref import TorchAttention


def _build_kernel() -> Any:
    """Compile-on-first-use kernel; kept inside a function so importing this module is free."""
    import triton
    import triton.language as tl

    @triton.jit
    def paged_decode(
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
        q = tl.load(
            q_ptr + seq * stride_q_tok + head * stride_q_head + dims, mask=dim_ok, other=0.0
        )
        q = q.to(tl.float32)
        running_max = tl.full([], float("-inf"), dtype=tl.float32)
        denom = tl.zeros([], dtype=tl.float32)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for start in range(0, kv_len, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            pos_ok = pos < kv_len
            page = tl.load(page_table_ptr + seq * stride_pt_seq + pos // PAGE_SIZE, mask=pos_ok)
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

    return paged_decode, triton.next_power_of_2


class TritonDecodeAttention:
    """Triton kernel for decode-only batches; the torch reference for anything else."""

    name = "triton"

    def __init__(self) -> None:
        self._kernel, self._next_pow2 = _build_kernel()
        self._fallback = TorchAttention()

    def prepare(self, batch: AttentionBatch) -> Any:
        return None if batch.is_decode_only else self._fallback.prepare(batch)

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: PagedKVCache,
        batch: AttentionBatch,
        state: Any,
        scale: float,
    ) -> torch.Tensor:
        if state is not None:
            return self._fallback.forward(layer, q, k, v, cache, batch, state, scale)
        cache.write(layer, batch.slot_mapping, k, v)
        heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
        k_flat = cache.k[layer].view(-1, kv_heads, dim)
        v_flat = cache.v[layer].view(-1, kv_heads, dim)
        q = q.contiguous()
        out = torch.empty_like(q)
        self._kernel[(batch.batch_size, heads)](
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
            BLOCK_D=self._next_pow2(dim),
            BLOCK_N=64,
        )
        return out
