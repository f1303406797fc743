"""Decode rounds as CUDA graphs: one captured forward per batch-size bucket.

A decode round's shapes depend only on its batch size, so the runner can capture the whole
forward once per bucket and replay it with a few host-to-device copies instead of a few
hundred kernel launches. A round of ``n`` decodes runs in the smallest bucket ``b >= n``
(buckets: ``1, 2, 4, 8``, then every 8 up to the rank's batch size; ``graph_buckets``)::

    static buffers (one set per bucket)      rows 0..n-1: the round's decodes
      input_ids, positions, slot_mapping,    rows n..b-1: padding -- one token at position 0
      page_table, kv_lens, cu_query_lens       in the scratch page (the cache's last page,
                                               which the KV pool never hands out); its K/V
                                               lands there and its logits are dropped

Under attention DP with MoE, the group's collectives (DeepEP's low-latency legs) are inside
the graph, so every rank replays the same bucket: the group's, from the round's gathered rows
(``round_bucket``: ``graph_buckets.group_bucket``). A rank with fewer decodes pads further;
a rank with none replays the bucket with every row padding. Every bucket is captured at startup
(``capture_all``, the same order on every rank: its warm-up forwards run the collectives),
never on first use, which would stall the group mid-serving.

Only the page table's used columns are copied each round (the longest request's pages): the
decode kernels read a row's pages only up to its ``kv_lens``, so columns past those keep
whatever an earlier round wrote and are never read.

Eager instead: rounds with an extend (their shapes vary with the chunks), more decodes than
the largest bucket, ``--enforce-eager``, and what cannot be captured: any device but CUDA,
MoE backends whose dispatch reads expert counts back to the host (a backend declares
``is_graph_safe`` when it does not), and attention backends other than ``triton`` (the torch
reference sizes its mask from the longest sequence, FlashInfer plans on the host). The
Triton decode kernels read lengths and pages from device tensors, so one capture serves every
round of its bucket.

``capture=False`` runs the same static-buffer path without a graph (each "replay" calls the
forward again): what the CPU tests exercise, padding included; ``capture_with`` stands in for
the CUDA graph capture in tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from roundgate.actors.model.graph_buckets import bucket_for, capture_sizes, group_bucket
from roundgate.gate.rows import RankRow
from roundgate.kernels.attention.batch import AttentionBatch

# One forward over an AttentionBatch: (input ids, batch) -> logits at every row.
ForwardFn = Callable[[torch.Tensor, AttentionBatch], torch.Tensor]


class CapturedForward(Protocol):
    """One bucket's forward, captured: ``replay`` rewrites ``logits`` from the static buffers."""

    logits: torch.Tensor

    def replay(self) -> None: ...


# How a bucket's forward is captured: given the forward over its static buffers.
Capture = Callable[[Callable[[], torch.Tensor]], CapturedForward]


class CudaGraphForward:
    """A bucket's forward as a CUDA graph, warmed up first on a side stream (Triton compiles
    on first launch; capture must not)."""

    def __init__(
        self,
        forward_once: Callable[[], torch.Tensor],
        device: torch.device,
        pool: tuple[int, int] | None,
    ) -> None:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                forward_once()
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = forward_once()

    def replay(self) -> None:
        self.graph.replay()


def ineligibility(
    device_type: str,
    enforce_eager: bool,
    is_moe: bool,
    attention_backend: str,
    moe_graph_safe: bool = False,
) -> str | None:
    """Why decode rounds cannot be captured here, or ``None`` when they can.

    ``moe_graph_safe``: the MoE backend's ``is_graph_safe`` (no host read in its legs).
    """
    if enforce_eager:
        return "--enforce-eager"
    if device_type != "cuda":
        return f"CUDA graphs need a CUDA device, got {device_type}"
    if is_moe and not moe_graph_safe:
        return "MoE dispatch reads expert counts back to the host"
    if attention_backend != "triton":
        return f"the {attention_backend} attention backend is not capturable (use triton)"
    return None


def pad_decodes(
    token_ids: Sequence[int],
    positions: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    bucket: int,
    page_size: int,
    scratch_page: int,
    num_columns: int | None = None,
) -> dict[str, torch.Tensor]:
    """The round's decodes padded to ``bucket`` rows, as host tensors named like the static
    buffers (padding rows: one token at position 0 in ``scratch_page``).

    The page table has ``num_columns`` columns, by default the longest request's pages (at
    least one): the columns a round copies. Zero decodes is a bucket of padding.
    """
    count = len(token_ids)
    if not 0 <= count <= bucket or len(positions) != count or len(page_tables) != count:
        raise ValueError(
            f"{count} decodes ({len(positions)} positions, {len(page_tables)} page tables) "
            f"do not fit a bucket of {bucket}"
        )
    longest = max((len(pages) for pages in page_tables), default=1)
    columns = max(1, longest) if num_columns is None else num_columns
    if longest > columns:
        raise ValueError(f"a request holds {longest} pages, more than the {columns} columns")
    padding = bucket - count
    table = [[*pages, *[scratch_page] * (columns - len(pages))] for pages in page_tables]
    table += [[scratch_page] * columns] * padding
    pos = [*positions, *[0] * padding]
    slots = [
        row[p // page_size] * page_size + p % page_size for row, p in zip(table, pos, strict=True)
    ]
    return {
        "input_ids": torch.tensor([*token_ids, *[0] * padding], dtype=torch.long),
        "positions": torch.tensor(pos, dtype=torch.long),
        "slot_mapping": torch.tensor(slots, dtype=torch.long),
        "page_table": torch.tensor(table, dtype=torch.long),
        "kv_lens": torch.tensor([p + 1 for p in pos], dtype=torch.long),
        "cu_query_lens": torch.arange(bucket + 1),
    }


class _Bucket:
    """One bucket's static buffers, its batch view over them, and its graph (if captured)."""

    def __init__(
        self, size: int, max_pages: int, page_size: int, scratch_page: int, device: torch.device
    ) -> None:
        empty = pad_decodes([], [], [], size, page_size, scratch_page, max_pages)
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
        self.graph: CapturedForward | None = None


class DecodeGraphs:
    """Per-bucket static buffers for decode rounds, every bucket captured by ``capture_all``."""

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
        shared_bucket: bool = False,
        capture_with: Capture | None = None,
    ) -> None:
        """``shared_bucket``: the graphs hold the group's collectives (MoE dispatch), so every
        rank replays the group's bucket (``round_bucket``); ``capture_with``: a stand-in for
        the CUDA graph capture (tests)."""
        self.forward = forward
        self.shared_bucket = shared_bucket
        self.sizes = capture_sizes(max_batch_size)
        self.max_pages, self.page_size, self.scratch_page = max_pages, page_size, scratch_page
        self.device, self.capture = device, capture
        self.buckets: dict[int, _Bucket] = {}
        self._capture: Capture | None = None
        if capture and capture_with is not None:
            self._capture = capture_with
        elif capture:
            pool = torch.cuda.graph_pool_handle()  # the buckets share one memory pool
            self._capture = lambda once: CudaGraphForward(once, device, pool)
        self.num_replays = 0

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Build every bucket now, capturing its graph when ``capture``: largest first (the
        smaller graphs reuse the pool the largest allocated), in the same order on every rank,
        since under MoE the warm-up forwards run the group's collectives."""
        for size in sorted(self.sizes, reverse=True):
            if size not in self.buckets:
                self.buckets[size] = self._build(size)

    def round_bucket(self, rows: Sequence[RankRow]) -> int | None:
        """The bucket every rank replays this round, from the gathered ``rows``: the group's
        when the graphs hold collectives, else ``None`` (each rank pads to its own)."""
        return group_bucket(rows, self.sizes) if self.shared_bucket and rows else None

    @torch.inference_mode()
    def run(
        self,
        token_ids: Sequence[int],
        positions: Sequence[int],
        page_tables: Sequence[Sequence[int]],
        bucket: int | None = None,
    ) -> torch.Tensor | None:
        """Logits ``[n, vocab]`` for ``n`` decodes, or ``None`` when no bucket holds them.

        ``bucket``: the group's (``group_bucket``), replayed even with fewer decodes, or none
        (``n == 0``: every row padding, empty logits back); without it, this rank's own.
        """
        count = len(token_ids)
        if bucket is None:
            size = bucket_for(count, self.sizes)
            if size is None:
                return None
        elif bucket not in self.sizes:
            raise ValueError(f"bucket {bucket} is not one of the captured sizes {self.sizes}")
        elif count > bucket:
            raise ValueError(f"{count} decodes do not fit the group's bucket of {bucket}")
        else:
            size = bucket
        if any(len(p) > self.max_pages for p in page_tables):
            return None  # past max_model_len: the scheduler never plans it
        held = self.buckets.get(size)
        if held is None:
            if self._capture is not None:  # a capture now would stall the group mid-serving
                raise RuntimeError(f"decode bucket {size} was not captured: call capture_all()")
            held = self.buckets[size] = self._build(size)
        padded = pad_decodes(
            token_ids, positions, page_tables, size, self.page_size, self.scratch_page
        )
        for name, tensor in padded.items():
            static = held.buffers[name]
            if name == "page_table":  # the used columns only
                static = static[:, : tensor.shape[1]]
            static.copy_(tensor, non_blocking=True)
        self.num_replays += 1
        if held.graph is not None:
            held.graph.replay()
            return held.graph.logits[:count]
        return self.forward(held.buffers["input_ids"], held.batch)[:count]

    def _build(self, size: int) -> _Bucket:
        bucket = _Bucket(size, self.max_pages, self.page_size, self.scratch_page, self.device)
        if self._capture is not None:
            # Every launch reads only the bucket's static buffers; the forward's default legs
            # are the low-latency ones (a replayed round never extends).
            ids = bucket.buffers["input_ids"]
            bucket.graph = self._capture(lambda: self.forward(ids, bucket.batch))
        return bucket
