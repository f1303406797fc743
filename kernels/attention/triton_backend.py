"""The ``triton`` attention backends: paged GQA and latent (MLA) attention on Triton kernels.

GQA: decode-only rounds run ``triton_decode`` (one program per sequence and head), any
round with an extend runs ``triton_extend`` over the whole ragged batch (decodes included:
a one-token chunk is just a short extend). MLA: every round runs the absorbed kernel of
``triton_mla``, ``W_uk`` folded into the query before it and ``W_uv`` applied after.

On CUDA the kernels are compiled; on CPU they run under Triton's interpreter only
(``TRITON_INTERPRET=1`` in the environment before the process imports triton: Triton fixes
the mode of its own ``tl`` helpers then), which the backend selection checks. The kernel
modules import triton, so this module is imported only when a Triton backend is built.
"""

from __future__ import annotations

import torch

from roundgate.kernels.attention.batch import AttentionBatch, PagedKVCache
from roundgate.kernels.attention.triton_decode import paged_decode
from roundgate.kernels.attention.triton_extend import paged_extend
from roundgate.kernels.attention.triton_mla import mla_absorbed


def is_all_decodes(batch: AttentionBatch) -> bool:
    """Every sequence brings exactly one new token (the decode kernel's shape)."""
    return batch.num_tokens == batch.batch_size and batch.is_decode_only


class TritonAttention:
    """Paged GQA attention on the Triton decode and extend kernels (no per-forward state)."""

    name = "triton"

    def prepare(self, batch: AttentionBatch) -> None:
        del batch  # the kernels read the batch's page table and lengths directly

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: PagedKVCache,
        batch: AttentionBatch,
        state: None,
        scale: float,
    ) -> torch.Tensor:
        """``q: [T, H, D]``, ``k, v: [T, H_kv, D]`` -> ``[T, H, D]``; writes k/v to the cache."""
        del state
        cache.write(layer, batch.slot_mapping, k, v)
        kernel = paged_decode if is_all_decodes(batch) else paged_extend
        return kernel(q, cache.k[layer], cache.v[layer], batch, scale)


class TritonMLAAttention:
    """Latent attention on the absorbed Triton kernel, for decodes and extends alike."""

    name = "triton"

    def prepare(self, batch: AttentionBatch) -> None:
        del batch

    def forward_latent(
        self,
        layer: int,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        latent: torch.Tensor,
        k_pe: torch.Tensor,
        w_uk: torch.Tensor,
        w_uv: torch.Tensor,
        cache: PagedKVCache,
        batch: AttentionBatch,
        state: None,
        scale: float,
    ) -> torch.Tensor:
        """``q_nope [T, H, dn]``, ``q_pe [T, H, dr]``, ``latent [T, r]``, ``k_pe [T, dr]``
        (RoPE applied) -> ``[T, H, dv]``; writes ``[latent | k_pe]`` to the cache."""
        del state
        cache.write_latent(layer, batch.slot_mapping, torch.cat((latent, k_pe), dim=-1))
        return self.attend_latent(layer, q_nope, q_pe, w_uk, w_uv, cache, batch, scale)

    def attend_latent(
        self,
        layer: int,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        w_uk: torch.Tensor,
        w_uv: torch.Tensor,
        cache: PagedKVCache,
        batch: AttentionBatch,
        scale: float,
    ) -> torch.Tensor:
        """``forward_latent`` once the round's entries are in the cache (the fused path's
        ``mla_prep`` wrote them): ``W_uk`` into the query, the kernel, then ``W_uv``."""
        q_lat = torch.einsum("thd,hdr->thr", q_nope, w_uk)
        out = mla_absorbed(q_lat, q_pe, cache.k[layer], batch, scale)
        return torch.einsum("thr,hvr->thv", out, w_uv)
