"""The paged KV cache and the per-forward batch metadata every attention backend reads.

Cache layout (one pair of tensors per layer, the layout FlashInfer calls NHD)::

    k[layer]: [num_pages, page_size, num_kv_heads, head_dim]    (v[layer] the same)
    slot s = page_id * page_size + offset  ->  k[layer].view(-1, H_kv, D)[s]

Latent layout (MLA): ``k[layer]`` is ``[num_pages, page_size, 1, width]`` (the compressed KV
and the RoPE key of each token, ``width = kv_lora_rank + qk_rope_head_dim``) and ``v`` is
empty: per-head K/V are never stored.

Token ``j`` of sequence ``b`` lives in page ``page_table[b][j // page_size]`` at offset
``j % page_size``. Page ids come from the rank's ``KVPool``; this module never allocates
pages, it only addresses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class PagedKVCache:
    """The rank's KV tensors: ``num_pages`` pages of ``page_size`` slots, per layer."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    page_size: int

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> PagedKVCache:
        # Zero-filled, not empty: masked-out slots are still read by the dense reference,
        # and uninitialised memory may hold NaN bit patterns.
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        return cls(
            k=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            v=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            page_size=page_size,
        )

    @classmethod
    def allocate_latent(
        cls,
        num_layers: int,
        num_pages: int,
        page_size: int,
        width: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> PagedKVCache:
        """One ``width``-wide entry per token and layer, no V tensors (MLA's latent)."""
        shape = (num_pages, page_size, 1, width)
        return cls(
            k=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            v=[],
            page_size=page_size,
        )

    @property
    def num_pages(self) -> int:
        return self.k[0].shape[0]

    @property
    def bytes_per_token(self) -> int:
        """Bytes one cached token occupies, every layer and tensor together."""
        tensors = [*self.k, *self.v]
        return sum(t[0, 0].numel() * t.element_size() for t in tensors)

    def write_latent(self, layer: int, slots: torch.Tensor, entries: torch.Tensor) -> None:
        """Store the new tokens' latent entries (``[T, width]``) at their slots."""
        self.k[layer].view(-1, entries.shape[-1]).index_copy_(0, slots, entries)

    @property
    def _parts(self) -> list[list[torch.Tensor]]:
        return [self.k, self.v] if self.v else [self.k]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new tokens' K/V (``[T, H_kv, D]``) at their slots."""
        kv_heads, head_dim = k.shape[1], k.shape[2]
        self.k[layer].view(-1, kv_heads, head_dim).index_copy_(0, slots, k)
        self.v[layer].view(-1, kv_heads, head_dim).index_copy_(0, slots, v)

    def read_pages(self, page_ids: Sequence[int]) -> torch.Tensor:
        """A host copy of some pages of every layer: ``[parts, layers, pages, page_size, H, D]``
        (parts: K and V, or the latent alone)."""
        index = torch.tensor(list(page_ids), dtype=torch.long, device=self.k[0].device)
        parts = [torch.stack([t.index_select(0, index) for t in part]) for part in self._parts]
        return torch.stack(parts).to("cpu")

    def write_pages(self, page_ids: Sequence[int], saved: torch.Tensor) -> None:
        """Inverse of ``read_pages``: put a host copy back into (possibly other) pages."""
        device = self.k[0].device
        index = torch.tensor(list(page_ids), dtype=torch.long, device=device)
        saved = saved.to(device)
        for p, part in enumerate(self._parts):
            for layer, tensor in enumerate(part):
                tensor.index_copy_(0, index, saved[p, layer])


@dataclass(frozen=True)
class AttentionBatch:
    """A ragged batch: sequence ``b`` brings ``query_lens[b]`` new tokens after
    ``cached_lens[b]`` tokens already in its pages, and attends causally to all of them.

    Built once per forward and shared by every layer.
    """

    query_lens: list[int]
    cached_lens: list[int]
    page_size: int
    # [B + 1] prefix sums of query_lens (rows of sequence b are cu[b]:cu[b+1] of the batch).
    cu_query_lens: torch.Tensor
    # [B] total tokens each sequence attends to (cached + new).
    kv_lens: torch.Tensor
    # [B, max_pages] page ids, padded with page 0 (never read past kv_lens).
    page_table: torch.Tensor
    # [T] absolute position of every new token (RoPE reads these too).
    positions: torch.Tensor
    # [T] cache slot of every new token.
    slot_mapping: torch.Tensor

    @property
    def batch_size(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    @property
    def max_kv_len(self) -> int:
        return max(
            (c + q for c, q in zip(self.cached_lens, self.query_lens, strict=True)), default=0
        )

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def build_attention_batch(
    query_lens: Sequence[int],
    cached_lens: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    page_size: int,
    device: torch.device | str = "cpu",
) -> AttentionBatch:
    """Metadata for one forward, without a per-token Python loop.

    ``ValueError`` if a page table is too short for its sequence: that is a scheduler bug
    that would otherwise write K/V into another request's pages.
    """
    query_lens, cached_lens = list(query_lens), list(cached_lens)
    kv_lens = [c + q for c, q in zip(cached_lens, query_lens, strict=True)]
    max_pages = max((len(p) for p in page_tables), default=0)
    for b, pages in enumerate(page_tables):
        if len(pages) * page_size < kv_lens[b]:
            raise ValueError(
                f"sequence {b}: {len(pages)} pages of {page_size} tokens cannot hold "
                f"{kv_lens[b]} tokens"
            )
    padded = [[*p, *[0] * (max_pages - len(p))] for p in page_tables]
    page_table = torch.tensor(padded, dtype=torch.long).reshape(len(padded), max_pages)
    if all(q == 1 for q in query_lens):
        # Decodes (the hot path): one token per sequence at position cached_len; a few list
        # lookups per sequence beat a dozen tiny tensor ops.
        slots = [
            pages[pos // page_size] * page_size + pos % page_size
            for pages, pos in zip(page_tables, cached_lens, strict=True)
        ]
        cu = torch.arange(len(query_lens) + 1)
        positions = torch.tensor(cached_lens, dtype=torch.long)
        slot_mapping = torch.tensor(slots, dtype=torch.long)
    else:
        q_lens = torch.tensor(query_lens, dtype=torch.long)
        cu = torch.zeros(len(query_lens) + 1, dtype=torch.long)
        torch.cumsum(q_lens, 0, out=cu[1:])
        seq_of_token = torch.repeat_interleave(torch.arange(len(query_lens)), q_lens)
        offset_in_chunk = torch.arange(int(cu[-1])) - cu[:-1][seq_of_token]
        positions = torch.tensor(cached_lens, dtype=torch.long)[seq_of_token] + offset_in_chunk
        pages_of_token = page_table[seq_of_token, positions // page_size]
        slot_mapping = pages_of_token * page_size + positions % page_size
    return AttentionBatch(
        query_lens=query_lens,
        cached_lens=cached_lens,
        page_size=page_size,
        cu_query_lens=cu.to(device),
        kv_lens=torch.tensor(kv_lens, dtype=torch.long, device=device),
        page_table=page_table.to(device),
        positions=positions.to(device),
        slot_mapping=slot_mapping.to(device),
    )
