"""Paged attention in plain torch: the CPU backend and the correctness oracle for the others.

Each forward gathers every sequence's K/V into a padded ``[B, L_max]`` block (one
``index_select`` per layer over slot ids computed once per forward) and runs SDPA with a
boolean mask. The padding costs memory on very ragged batches, but it keeps the
reference short and obviously right, with no per-sequence Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.attention.batch import AttentionBatch, PagedKVCache


@dataclass(frozen=True)
class TorchAttentionState:
    """What ``prepare`` computes once per forward for every layer to reuse."""

    # [B * L_max] cache slots of every (sequence, key position), padded rows point at slot 0.
    kv_slots: torch.Tensor
    # [B, 1, Q_max, L_max] True where query row may attend to key column.
    mask: torch.Tensor
    # [T] row of each new token in the flattened [B * Q_max] padded query block; None when
    # every sequence brings exactly one token (then the batch is already [B, 1]).
    query_rows: torch.Tensor | None


class TorchAttention:
    """Reference paged attention (prefill/extend and decode in one path)."""

    name = "torch"

    def prepare(self, batch: AttentionBatch) -> TorchAttentionState:
        device = batch.slot_mapping.device
        size, q_max, l_max = batch.batch_size, batch.max_query_len, batch.max_kv_len
        key_pos = torch.arange(l_max, device=device)
        ps = batch.page_size
        kv_slots = batch.page_table[:, key_pos // ps] * ps + key_pos % ps
        if batch.is_decode_only:
            mask = (key_pos[None, :] < batch.kv_lens[:, None]).view(size, 1, 1, l_max)
            query_rows = None
        else:
            cached = batch.kv_lens - (batch.cu_query_lens[1:] - batch.cu_query_lens[:-1])
            query_pos = cached[:, None] + torch.arange(q_max, device=device)[None, :]
            mask = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)
            lens = batch.cu_query_lens[1:] - batch.cu_query_lens[:-1]
            seq_of_token = torch.repeat_interleave(torch.arange(size, device=device), lens)
            offset = (
                torch.arange(batch.num_tokens, device=device)
                - batch.cu_query_lens[:-1][seq_of_token]
            )
            query_rows = seq_of_token * q_max + offset
        return TorchAttentionState(kv_slots.reshape(-1), mask, query_rows)

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
        size, q_max, l_max = batch.batch_size, batch.max_query_len, batch.max_kv_len
        heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
        keys = cache.k[layer].view(-1, kv_heads, dim).index_select(0, state.kv_slots)
        values = cache.v[layer].view(-1, kv_heads, dim).index_select(0, state.kv_slots)
        keys = keys.view(size, l_max, kv_heads, dim).transpose(1, 2)
        values = values.view(size, l_max, kv_heads, dim).transpose(1, 2)
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
            attn_mask=state.mask,
            scale=scale,
            enable_gqa=heads != kv_heads,
        )
        out = out.transpose(1, 2).reshape(size * q_max, heads, dim)
        if state.query_rows is not None:
            out = out.index_select(0, state.query_rows)
        return out
