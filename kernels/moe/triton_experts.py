"""Fused MoE experts in Triton: grouped GEMMs over the rows a dispatch sorted by expert.

The same contract as ``run_experts`` (``kernels/moe/base.py``): ``hidden [N, H]`` holds
``counts[e]`` rows for local expert ``e``, in expert order; ``w13 [E, 2I, H]`` is gate then
up, ``w2 [E, H, I]``; the result is each row's *unweighted* expert output (``combine``
applies the router weights), so it serves every dispatch backend.

Tiling: the rows are cut into tiles of ``BLOCK_M`` rows that never straddle two experts (a
tile table, built from ``counts`` with a few tensor ops, gives each tile its expert and row
range; the last tile of an expert is masked). Two launches:

1. gate/up: one program per (row tile, ``BLOCK_N`` columns of the intermediate size) runs
   both GEMMs over ``BLOCK_K`` slices of the hidden size, from the same ``x`` tile, into two
   float32 accumulators, and stores ``silu(gate) * up`` -- the ``[N, 2I]`` gate/up output is
   never written;
2. down: one program per (row tile, ``BLOCK_N`` columns of the hidden size) multiplies the
   activations by the expert's ``w2`` over ``BLOCK_K`` slices of the intermediate size.

Experts without rows have no tiles and cost nothing. Every dimension is masked, so sizes
need not be multiples of the blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

BLOCK_M = 16
BLOCK_N = 64
BLOCK_K = 64


@triton.jit
def gate_up_silu_tile(
    x_ptr,
    x_rows,
    row_ok,
    w_base,
    cols,
    col_ok,
    hidden,
    inter,
    stride_x,
    stride_w_row,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``silu(x @ gate^T) * (x @ up^T)`` for rows ``x_rows`` of ``x`` and columns ``cols`` of
    one expert's ``w13`` (at ``w_base``): both GEMMs over ``BLOCK_K`` slices of the hidden
    size from the same ``x`` tile, float32 (shared with ``triton_fused_moe``)."""
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k_start in range(0, hidden, BLOCK_K):
        ks = k_start + tl.arange(0, BLOCK_K)
        k_ok = ks < hidden
        x = tl.load(
            x_ptr + x_rows[:, None] * stride_x + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w_mask = k_ok[:, None] & col_ok[None, :]
        w_gate = tl.load(
            w_base + cols[None, :] * stride_w_row + ks[:, None], mask=w_mask, other=0.0
        )
        w_up = tl.load(
            w_base + (cols + inter)[None, :] * stride_w_row + ks[:, None],
            mask=w_mask,
            other=0.0,
        )
        gate += tl.dot(x, w_gate, input_precision="ieee")
        up += tl.dot(x, w_up, input_precision="ieee")
    return gate * tl.sigmoid(gate) * up  # silu(gate) * up


@triton.jit
def down_tile(
    act_ptr,
    act_rows,
    row_ok,
    w_base,
    cols,
    col_ok,
    inter,
    stride_act,
    stride_w_row,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``act @ w2^T`` for rows ``act_rows`` of ``act`` and columns ``cols`` of one expert's
    ``w2`` (at ``w_base``), over ``BLOCK_K`` slices of the intermediate size, float32."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k_start in range(0, inter, BLOCK_K):
        ks = k_start + tl.arange(0, BLOCK_K)
        k_ok = ks < inter
        a = tl.load(
            act_ptr + act_rows[:, None] * stride_act + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            w_base + cols[None, :] * stride_w_row + ks[:, None],
            mask=k_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        acc += tl.dot(a, w, input_precision="ieee")
    return acc


@triton.jit
def _gate_up_silu_kernel(
    x_ptr,
    w13_ptr,
    act_ptr,
    tile_expert_ptr,
    tile_start_ptr,
    tile_end_ptr,
    hidden,
    inter,
    stride_x,
    stride_w_expert,
    stride_w_row,
    stride_act,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    tile = tl.program_id(0)
    col_block = tl.program_id(1)
    expert = tl.load(tile_expert_ptr + tile)
    rows = tl.load(tile_start_ptr + tile) + tl.arange(0, BLOCK_M)
    row_ok = rows < tl.load(tile_end_ptr + tile)
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    w_base = w13_ptr + expert * stride_w_expert
    act = gate_up_silu_tile(
        x_ptr,
        rows,
        row_ok,
        w_base,
        cols,
        col_ok,
        hidden,
        inter,
        stride_x,
        stride_w_row,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )
    tl.store(
        act_ptr + rows[:, None] * stride_act + cols[None, :],
        act.to(act_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


@triton.jit
def _down_kernel(
    act_ptr,
    w2_ptr,
    out_ptr,
    tile_expert_ptr,
    tile_start_ptr,
    tile_end_ptr,
    hidden,
    inter,
    stride_act,
    stride_w_expert,
    stride_w_row,
    stride_out,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    tile = tl.program_id(0)
    col_block = tl.program_id(1)
    expert = tl.load(tile_expert_ptr + tile)
    rows = tl.load(tile_start_ptr + tile) + tl.arange(0, BLOCK_M)
    row_ok = rows < tl.load(tile_end_ptr + tile)
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    w_base = w2_ptr + expert * stride_w_expert
    acc = down_tile(
        act_ptr,
        rows,
        row_ok,
        w_base,
        cols,
        col_ok,
        inter,
        stride_act,
        stride_w_row,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )
    tl.store(
        out_ptr + rows[:, None] * stride_out + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


def tile_table(
    counts: Sequence[int], block_m: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(expert, start, end)`` per tile of ``block_m`` rows: tiles never straddle experts.

    Example: counts ``[3, 0, 18]`` with ``block_m`` 16 -> experts ``[0, 2, 2]``, starts
    ``[0, 3, 19]``, ends ``[3, 21, 21]``.
    """
    sizes = torch.tensor(list(counts), dtype=torch.long)
    tiles = (sizes + block_m - 1) // block_m
    expert = torch.repeat_interleave(torch.arange(len(sizes)), tiles)
    first_row = torch.cumsum(sizes, 0) - sizes
    first_tile = torch.cumsum(tiles, 0) - tiles
    start = first_row[expert] + (torch.arange(len(expert)) - first_tile[expert]) * block_m
    end = (first_row + sizes)[expert]
    return expert.to(device), start.to(device), end.to(device)


def triton_run_experts(
    hidden: torch.Tensor, counts: list[int], w13: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    """SwiGLU experts over grouped rows (``run_experts``' contract) on the two fused kernels."""
    rows, size = hidden.shape
    inter = w2.shape[-1]
    if sum(counts) != rows or len(counts) != w13.shape[0]:
        raise ValueError(
            f"expert counts {counts} do not match {rows} rows and {w13.shape[0]} local experts"
        )
    out = torch.empty_like(hidden)
    if rows == 0:
        return out
    hidden, w13, w2 = hidden.contiguous(), w13.contiguous(), w2.contiguous()
    expert, start, end = tile_table(counts, BLOCK_M, hidden.device)
    act = hidden.new_empty(rows, inter)
    num_tiles = expert.shape[0]
    _gate_up_silu_kernel[(num_tiles, -(-inter // BLOCK_N))](
        hidden,
        w13,
        act,
        expert,
        start,
        end,
        size,
        inter,
        hidden.stride(0),
        w13.stride(0),
        w13.stride(1),
        act.stride(0),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
    )
    _down_kernel[(num_tiles, -(-size // BLOCK_N))](
        act,
        w2,
        out,
        expert,
        start,
        end,
        size,
        inter,
        act.stride(0),
        w2.stride(0),
        w2.stride(1),
        out.stride(0),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
    )
    return out
