"""FlashInfer paged attention (CUDA only; the optional ``gpu`` extra provides ``flashinfer``).

Our cache is already FlashInfer's NHD paged layout (``[pages, page_size, H_kv, D]`` per
layer, see ``batch.py``), so the adapter only translates the page tables into FlashInfer's
CSR form (``indptr``/``indices``/``last_page_len``) once per forward, plans the wrapper
once, and runs it for every layer. Decode-only rounds use the decode wrapper; rounds with
an extend use the prefill wrapper, whose causal mask is aligned to the end of each
sequence (query ``i`` of a chunk sees the cached prefix plus rows ``0..i``).
"""

from __future__ import annotations

from typing import Any

import torch

from roundgate.kernels.attention.batch import AttentionBatch, PagedKVCache

WORKSPACE_BYTES = 128 * 1024 * 1024


def paged_csr(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(kv_indptr, kv_indices, last_page_len)`` as int32, using only the pages in use."""
    ps = batch.page_size
    pages_used = (batch.kv_lens + ps - 1) // ps
    cols = torch.arange(batch.page_table.shape[1], device=batch.page_table.device)
    in_use = cols[None, :] < pages_used[:, None]
    indices = batch.page_table[in_use].to(torch.int32)
    indptr = torch.zeros(batch.batch_size + 1, dtype=torch.int32, device=indices.device)
    torch.cumsum(pages_used, 0, out=indptr[1:])
    last_page_len = (batch.kv_lens - (pages_used - 1) * ps).to(torch.int32)
    return indptr, indices, last_page_len


class FlashInferAttention:
    """Batched paged prefill/decode through FlashInfer's planned wrappers."""

    name = "flashinfer"

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: Any
    ) -> None:
        import flashinfer

        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._shape = (num_heads, num_kv_heads, head_dim)
        self._dtype = dtype

    def prepare(self, batch: AttentionBatch) -> Any:
        heads, kv_heads, dim = self._shape
        indptr, indices, last_len = paged_csr(batch)
        if batch.is_decode_only:
            self._decode.plan(
                indptr,
                indices,
                last_len,
                heads,
                kv_heads,
                dim,
                batch.page_size,
                sm_scale=dim**-0.5,
                q_data_type=self._dtype,
                kv_data_type=self._dtype,
            )
            return self._decode
        self._prefill.plan(
            batch.cu_query_lens.to(torch.int32),
            indptr,
            indices,
            last_len,
            heads,
            kv_heads,
            dim,
            batch.page_size,
            causal=True,
            sm_scale=dim**-0.5,
            q_data_type=self._dtype,
            kv_data_type=self._dtype,
        )
        return self._prefill

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
        # The wrappers were planned with 1/sqrt(head_dim), the only scale our models use.
        del scale
        cache.write(layer, batch.slot_mapping, k, v)
        return state.run(q.contiguous(), (cache.k[layer], cache.v[layer]))
