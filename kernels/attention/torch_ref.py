"""Paged attention in plain torch: the CPU backend and the correctness oracle for the others.

Each forward gathers every sequence's pages into a padded ``[B, P * page_size]`` block (one
page-granular ``index_select`` per layer and tensor, over page ids computed once per
forward; whole pages copy as contiguous runs and need no reshape) and runs SDPA with an
additive float mask (SDPA converts a boolean mask on every call, which costs more than the
attention itself at decode sizes). The padding costs memory on very ragged batches, but it
keeps the reference short and obviously right, with no per-sequence Python loop.

One fast path: a lone sequence with nothing cached (a fresh prompt) attends to exactly its
own new K/V, so it skips the gather and uses SDPA's built-in causal kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from roundgate.kernels.attention.batch import AttentionBatch, PagedKVCache


@dataclass(frozen=True)
class TorchAttentionState:
    """What ``prepare`` computes once per forward for every layer to reuse."""

    # [B * P] pages of every sequence (P: pages of the longest one), padded with page 0;
    # on the fresh-prompt fast path, unused.
    pages: torch.Tensor
    # [B, 1, Q_max, P * page_size] additive mask: 0 where a query row may attend to a key,
    # else -inf; None on the fresh-prompt fast path (SDPA's is_causal instead).
    mask: torch.Tensor | None
    # [T] row of each new token in the flattened [B * Q_max] padded query block; None when
    # every sequence brings exactly one token (then the batch is already [B, 1]).
    query_rows: torch.Tensor | None


class TorchAttention:
    """Reference paged attention (prefill/extend and decode in one path)."""

    name = "torch"

    def prepare(self, batch: AttentionBatch) -> TorchAttentionState:
        device = batch.slot_mapping.device
        size, q_max = batch.batch_size, batch.max_query_len
        if size == 1 and batch.cached_lens[0] == 0:
            return TorchAttentionState(batch.page_table, None, None)
        num_pages = -(-batch.max_kv_len // batch.page_size)
        l_max = num_pages * batch.page_size
        key_pos = torch.arange(l_max, device=device)
        if batch.is_decode_only:
            allowed = (key_pos[None, :] < batch.kv_lens[:, None]).view(size, 1, 1, l_max)
            query_rows = None
        else:
            cached = batch.kv_lens - (batch.cu_query_lens[1:] - batch.cu_query_lens[:-1])
            query_pos = cached[:, None] + torch.arange(q_max, device=device)[None, :]
            allowed = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)
            lens = batch.cu_query_lens[1:] - batch.cu_query_lens[:-1]
            seq_of_token = torch.repeat_interleave(torch.arange(size, device=device), lens)
            offset = (
                torch.arange(batch.num_tokens, device=device)
                - batch.cu_query_lens[:-1][seq_of_token]
            )
            query_rows = seq_of_token * q_max + offset
        mask = torch.zeros(allowed.shape, device=device).masked_fill_(~allowed, float("-inf"))
        pages = batch.page_table[:, :num_pages].reshape(-1)
        return TorchAttentionState(pages, mask, query_rows)

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: PagedKVCache,
        batch: AttentionBatch,
        state: TorchAttentionState,
        scale: float,
    ) -> torch.Tensor:
        """``q: [T, H, D]``, ``k, v: [T, H_kv, D]`` -> ``[T, H, D]``; writes k/v to the cache."""
        cache.write(layer, batch.slot_mapping, k, v)
        size, q_max = batch.batch_size, batch.max_query_len
        heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
        if state.mask is None:  # a fresh prompt: its keys are exactly the new k/v
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1).unsqueeze(0),
                k.transpose(0, 1).unsqueeze(0),
                v.transpose(0, 1).unsqueeze(0),
                is_causal=True,
                scale=scale,
                enable_gqa=heads != kv_heads,
            )
            return out.squeeze(0).transpose(0, 1)
        keys = cache.k[layer].index_select(0, state.pages).view(size, -1, kv_heads, dim)
        values = cache.v[layer].index_select(0, state.pages).view(size, -1, kv_heads, dim)
        keys, values = keys.transpose(1, 2), values.transpose(1, 2)
        if state.query_rows is None:
            queries = q.view(size, 1, heads, dim)
        else:
            padded = q.new_zeros(size * q_max, heads, dim)
            padded.index_copy_(0, state.query_rows, q)
            queries = padded.view(size, q_max, heads, dim)
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2),
            keys,
            values,
            attn_mask=state.mask.to(q.dtype),
            scale=scale,
            enable_gqa=heads != kv_heads,
        )
        out = out.transpose(1, 2).reshape(size * q_max, heads, dim)
        if state.query_rows is not None:
            out = out.index_select(0, state.query_rows)
        return out
