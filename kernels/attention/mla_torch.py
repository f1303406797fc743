"""Latent (MLA) paged attention in plain torch: the CPU backend and the reference.

The cache holds one entry per token, ``[latent | k_pe]`` (see ``PagedKVCache`` latent
layout). With ``W_uk: [H, d_nope, r]`` and ``W_uv: [H, d_v, r]`` the two halves of
``kv_b_proj``:

* decodes (one query a sequence) run **absorbed**: the query becomes
  ``[q_nope @ W_uk | q_pe]`` (width ``r + d_rope``), attends as one-KV-head MQA straight
  over the cached entries with the latent as the value (two batched GEMMs), and ``W_uv``
  maps the result out; nothing per head is built for the cached tokens;
* extends expand the gathered latent to per-head K/V (``latent @ W_uk``, ``latent @ W_uv``),
  cheaper than absorbing when many queries share the keys.

Both reuse ``TorchAttention.prepare``'s page list and mask, so masking and paging are the
same code as the GQA reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from roundgate.kernels.attention.batch import AttentionBatch, PagedKVCache
from roundgate.kernels.attention.torch_ref import TorchAttention, TorchAttentionState


class TorchMLAAttention(TorchAttention):
    """Reference latent attention (extend and decode)."""

    name = "torch"

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
        state: TorchAttentionState,
        scale: float,
    ) -> torch.Tensor:
        """``q_nope [T, H, dn]``, ``q_pe [T, H, dr]``, ``latent [T, r]``, ``k_pe [T, dr]``
        (RoPE applied) -> ``[T, H, dv]``; writes ``[latent | k_pe]`` to the cache."""
        cache.write_latent(layer, batch.slot_mapping, torch.cat((latent, k_pe), dim=-1))
        rank, heads = latent.shape[-1], q_nope.shape[1]
        if state.mask is None:  # a fresh prompt: its keys are exactly the new tokens
            queries = torch.cat((q_nope, q_pe), dim=-1).transpose(0, 1).unsqueeze(0)
            keys, values = _expand(latent.unsqueeze(0), k_pe.unsqueeze(0), w_uk, w_uv)
            out = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale)
            return out.squeeze(0).transpose(0, 1)
        size, q_max = batch.batch_size, batch.max_query_len
        width = cache.k[layer].shape[-1]
        entries = cache.k[layer].index_select(0, state.pages).view(size, -1, width)
        mask = state.mask.to(q_nope.dtype)
        if state.query_rows is None:  # decodes: absorbed, against the latent itself
            # One KV head shared by every query head: two plain batched GEMMs over the
            # entries. (SDPA's GQA path would first copy the keys out to every head.)
            q_latent = torch.einsum("bhd,hdr->bhr", q_nope, w_uk)
            query = torch.cat((q_latent, q_pe), dim=-1)  # [B, H, r + dr]
            scores = torch.bmm(query, entries.transpose(1, 2)) * scale  # [B, H, L]
            probs = torch.softmax((scores + mask.view(size, 1, -1)).float(), dim=-1)
            out = torch.bmm(probs.to(entries.dtype), entries[..., :rank])  # [B, H, r]
            return torch.einsum("bhr,hvr->bhv", out, w_uv)
        keys, values = _expand(entries[..., :rank], entries[..., rank:], w_uk, w_uv)
        padded = q_nope.new_zeros(size * q_max, heads, q_nope.shape[-1] + q_pe.shape[-1])
        padded.index_copy_(0, state.query_rows, torch.cat((q_nope, q_pe), dim=-1))
        queries = padded.view(size, q_max, heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
        out = out.transpose(1, 2).reshape(size * q_max, heads, -1)
        return out.index_select(0, state.query_rows)


def _expand(
    latent: torch.Tensor, k_pe: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head ``keys [B, H, L, dn + dr]`` and ``values [B, H, L, dv]`` from the latent
    ``[B, L, r]`` and the shared RoPE key ``[B, L, dr]``."""
    heads = w_uk.shape[0]
    k_nope = torch.einsum("blr,hdr->bhld", latent, w_uk)
    values = torch.einsum("blr,hvr->bhlv", latent, w_uv)
    rope = k_pe.unsqueeze(1).expand(-1, heads, -1, -1)
    return torch.cat((k_nope, rope), dim=-1), values
