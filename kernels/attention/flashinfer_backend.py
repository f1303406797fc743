"""FlashInfer paged attention (CUDA only; the optional ``gpu`` extra provides ``flashinfer``).

Our cache is already FlashInfer's NHD paged layout (``[pages, page_size, H_kv, D]`` per
layer, see ``batch.py``), so the adapter only translates the page tables into FlashInfer's
CSR form (``indptr``/``indices``/``last_page_len``) once per forward, plans the wrapper
once, and runs it for every layer. Decode-only rounds use the decode wrapper; rounds with
an extend use the prefill wrapper, whose causal mask is aligned to the end of each
sequence (query ``i`` of a chunk sees the cached prefix plus rows ``0..i``).

``plan`` reads ``qo_indptr``, ``kv_indptr`` and ``last_page_len`` on the host (it sizes its
work split from them) and only copies ``indices`` to the device, so ``plan_arrays`` builds
the first three from the batch's Python lists and the page ids on the page table's device:
planning reads nothing back from the GPU.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any, NamedTuple

import torch

from roundgate.kernels.attention.batch import AttentionBatch, PagedKVCache

WORKSPACE_BYTES = 128 * 1024 * 1024

# The GQA group sizes FlashInfer's CUDA-core decode kernel is compiled for
# (``DISPATCH_GQA_GROUP_SIZE`` in include/flashinfer/utils.cuh, flashinfer-python 0.6.13): its
# plan raises "Unsupported group_size" for any other, e.g. Qwen2.5-7B's 7 or Qwen2.5-14B's 5.
CUDA_CORE_DECODE_GROUP_SIZES = frozenset({1, 2, 3, 4, 8})
# Above this group size the tensor-core decode is the faster one: SGLang's
# ``should_use_tensor_core`` (layers/attention/flashinfer_backend.py) and vLLM's v0 FlashInfer
# backend both switch at ``group > 4`` for 16-bit KV; vLLM's v1 backend always uses it.
MAX_CUDA_CORE_DECODE_GROUP = 4


def decode_uses_tensor_cores(num_heads: int, num_kv_heads: int) -> bool:
    """Whether decode runs FlashInfer's tensor-core kernel (``use_tensor_cores=True``).

    Yes where the CUDA-core kernel refuses the group size, and for groups above 4 as SGLang
    and vLLM's v0 backend do (the MMA tiles fill with 5+ query heads per KV head):

    >>> [decode_uses_tensor_cores(h, 4) for h in (4, 16, 20, 28, 32)]
    [False, False, True, True, True]
    """
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"num_attention_heads ({num_heads}) must be a positive multiple of "
            f"num_key_value_heads ({num_kv_heads}) for FlashInfer's grouped attention"
        )
    group = num_heads // num_kv_heads
    return group not in CUDA_CORE_DECODE_GROUP_SIZES or group > MAX_CUDA_CORE_DECODE_GROUP


class PlanArrays(NamedTuple):
    """FlashInfer's plan inputs for one forward (int32)."""

    qo_indptr: torch.Tensor  # [B + 1] host: prefix sums of query_lens
    kv_indptr: torch.Tensor  # [B + 1] host: prefix sums of pages in use
    kv_indices: torch.Tensor  # [kv_indptr[-1]] on the page table's device: the pages in use
    last_page_len: torch.Tensor  # [B] host: tokens in each sequence's last page


def plan_arrays(batch: AttentionBatch) -> PlanArrays:
    """The plan's arrays from the batch's host lists, with no read back from the device."""
    ps = batch.page_size
    kv_lens = [c + q for c, q in zip(batch.cached_lens, batch.query_lens, strict=True)]
    pages = [(n + ps - 1) // ps for n in kv_lens]
    kv_indptr = list(accumulate(pages, initial=0))
    last_page_len = [n - (p - 1) * ps for n, p in zip(kv_lens, pages, strict=True)]
    qo_indptr = list(accumulate(batch.query_lens, initial=0))

    def host(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32)

    return PlanArrays(
        host(qo_indptr), host(kv_indptr), page_indices(batch, kv_indptr[-1]), host(last_page_len)
    )


def page_indices(batch: AttentionBatch, num_pages: int) -> torch.Tensor:
    """The pages in use, row by row, gathered on the page table's device. ``num_pages`` (the
    total, known on the host) sizes the gather: a boolean mask would read the count back."""
    table = batch.page_table
    pages_used = (batch.kv_lens + batch.page_size - 1) // batch.page_size
    rows = torch.repeat_interleave(
        torch.arange(batch.batch_size, device=table.device), pages_used, output_size=num_pages
    )
    starts = torch.cumsum(pages_used, 0) - pages_used
    cols = torch.arange(num_pages, device=table.device) - starts[rows]
    return table[rows, cols].to(torch.int32)


def paged_csr(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(kv_indptr, kv_indices, last_page_len)`` as int32 on the batch's device, computed there
    (the boolean mask reads back a count): the reference ``plan_arrays`` is tested against."""
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

        tensor_cores = decode_uses_tensor_cores(num_heads, num_kv_heads)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=tensor_cores
        )
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._shape = (num_heads, num_kv_heads, head_dim)
        self._dtype = dtype

    def prepare(self, batch: AttentionBatch) -> Any:
        heads, kv_heads, dim = self._shape
        arrays = plan_arrays(batch)
        if batch.is_decode_only:
            self._decode.plan(
                arrays.kv_indptr,
                arrays.kv_indices,
                arrays.last_page_len,
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
            arrays.qo_indptr,
            arrays.kv_indptr,
            arrays.kv_indices,
            arrays.last_page_len,
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
