"""Decode rounds as CUDA graphs: one captured forward per batch-size bucket.

A decode round's shapes depend only on its batch size, so the runner can capture the whole
forward once per bucket and replay it with a few host-to-device copies instead of a few
hundred kernel launches. A round of ``n`` decodes runs in the smallest bucket ``b >= n``
(buckets: ``1, 2, 4, 8``, then every 8 up to the rank's batch size)::

    static buffers (one set per bucket)      rows 0..n-1: the round's decodes
      input_ids, positions, slot_mapping,    rows n..b-1: padding -- one token at position 0
      page_table, kv_lens, cu_query_lens       in the scratch page (the cache's last page,
                                               which the KV pool never hands out); its K/V
                                               lands there and its logits are dropped

Eager instead: rounds with an extend (their shapes vary with the chunks), more decodes than
the largest bucket, ``--enforce-eager``, and what cannot be captured: any device but CUDA,
MoE models (dispatch reads expert counts back to the host), and attention backends other
than ``triton`` (the torch reference sizes its mask from the longest sequence, FlashInfer
plans on the host). The Triton decode kernel reads lengths and pages from device tensors,
so one capture serves every round of its bucket.

``capture=False`` runs the same static-buffer path without a graph (each "replay" calls the
forward again): what the CPU tests exercise, padding included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from roundgate.kernels.attention.batch import AttentionBatch

# One forward over an AttentionBatch: (input ids, batch) -> logits at every row.
ForwardFn = Callable[[torch.Tensor, AttentionBatch], torch.Tensor]
MAX_CAPTURED_BATCH = 256


def capture_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Bucket sizes for a rank of ``max_batch_size`` running requests.

    Example: 20 -> ``(1, 2, 4, 8, 16, 20)``; 3 -> ``(1, 2, 3)``.
    """
    limit = min(max_batch_size, MAX_CAPTURED_BATCH)
    sizes = [s for s in (1, 2, 4) if s < limit] + list(range(8, limit, 8))
    return (*sizes, limit)


def bucket_for(batch_size: int, sizes: Sequence[int]) -> int | None:
    """The smallest bucket holding ``batch_size`` decodes; ``None``: run eagerly."""
    return next((s for s in sizes if s >= batch_size), None) if batch_size > 0 else None


def ineligibility(
    device_type: str, enforce_eager: bool, is_moe: bool, attention_backend: str
) -> str | None:
    """Why decode rounds cannot be captured here, or ``None`` when they can."""
    if enforce_eager:
        return "--enforce-eager"
    if device_type != "cuda":
        return f"CUDA graphs need a CUDA device, got {device_type}"
    if is_moe:
        return "MoE dispatch reads expert counts back to the host"
    if attention_backend != "triton":
        return f"the {attention_backend} attention backend is not capturable (use triton)"
    return None


def pad_decodes(
    token_ids: Sequence[int],
    positions: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    bucket: int,
    max_pages: int,
    page_size: int,
    scratch_page: int,
) -> dict[str, torch.Tensor]:
    """The round's decodes padded to ``bucket`` rows, as host tensors named like the static
    buffers (padding rows: one token at position 0 in ``scratch_page``)."""
    count = len(token_ids)
    if not 0 < count <= bucket:
        raise ValueError(f"{count} decodes do not fit a bucket of {bucket}")
    table = torch.full((bucket, max_pages), scratch_page, dtype=torch.long)
    for row, pages in enumerate(page_tables):
        table[row, : len(pages)] = torch.tensor(pages, dtype=torch.long)
    pos = torch.zeros(bucket, dtype=torch.long)
    pos[:count] = torch.tensor(list(positions), dtype=torch.long)
    rows = torch.arange(bucket)
    page_of_row = table[rows, pos // page_size]
    ids = torch.zeros(bucket, dtype=torch.long)
    ids[:count] = torch.tensor(list(token_ids), dtype=torch.long)
    return {
        "input_ids": ids,
        "positions": pos,
        "slot_mapping": page_of_row * page_size + pos % page_size,
        "page_table": table,
        "kv_lens": pos + 1,
        "cu_query_lens": torch.arange(bucket + 1),
    }


class _Bucket:
    """One bucket's static buffers, its batch view over them, and its graph (if captured)."""

    def __init__(self, size: int, max_pages: int, page_size: int, scratch_page: int, device):
        empty = pad_decodes([0], [0], [[scratch_page]], size, max_pages, page_size, scratch_page)
        self.buffers = {name: t.to(device) for name, t in empty.items()}
        b = self.buffers
        self.batch = AttentionBatch(
            query_lens=[1] * size,
            cached_lens=[0] * size,  # host copies are read for shapes only, never values
            page_size=page_size,
            cu_query_lens=b["cu_query_lens"],
            kv_lens=b["kv_lens"],
            page_table=b["page_table"],
            positions=b["positions"],
            slot_mapping=b["slot_mapping"],
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None


class DecodeGraphs:
    """Per-bucket static buffers for decode rounds, captured into CUDA graphs on first use."""

    def __init__(
        self,
        forward: ForwardFn,
        *,
        max_batch_size: int,
        max_pages: int,
        page_size: int,
        scratch_page: int,
        device: torch.device,
        capture: bool,
    ) -> None:
        self.forward = forward
        self.sizes = capture_sizes(max_batch_size)
        self.max_pages, self.page_size, self.scratch_page = max_pages, page_size, scratch_page
        self.device, self.capture = device, capture
        self.buckets: dict[int, _Bucket] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.num_replays = 0

    def run(
        self,
        token_ids: Sequence[int],
        positions: Sequence[int],
        page_tables: Sequence[Sequence[int]],
    ) -> torch.Tensor | None:
        """Logits ``[n, vocab]`` for ``n`` decodes, or ``None`` when no bucket holds them."""
        size = bucket_for(len(token_ids), self.sizes)
        if size is None or any(len(p) > self.max_pages for p in page_tables):
            return None
        bucket = self.buckets.get(size)
        if bucket is None:
            bucket = self.buckets[size] = self._build(size)
        padded = pad_decodes(
            token_ids,
            positions,
            page_tables,
            size,
            self.max_pages,
            self.page_size,
            self.scratch_page,
        )
        for name, tensor in padded.items():
            bucket.buffers[name].copy_(tensor, non_blocking=True)
        self.num_replays += 1
        if bucket.graph is not None and bucket.logits is not None:
            bucket.graph.replay()
            return bucket.logits[: len(token_ids)]
        return self.forward(bucket.buffers["input_ids"], bucket.batch)[: len(token_ids)]

    def _build(self, size: int) -> _Bucket:
        bucket = _Bucket(size, self.max_pages, self.page_size, self.scratch_page, self.device)
        if not self.capture:
            return bucket
        # Warm up on a side stream (Triton compiles on first launch; capture must not), then
        # capture; every launch reads only the bucket's static buffers.
        ids = bucket.buffers["input_ids"]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.forward(ids, bucket.batch)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            bucket.logits = self.forward(ids, bucket.batch)
        bucket.graph = graph
        return bucket
