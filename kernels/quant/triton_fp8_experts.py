"""Fused MoE experts over block-scaled FP8 weights, in Triton.

The contract of ``run_experts`` (``kernels/moe/base.py``) and the tiling of the bf16 kernels
(``kernels/moe/triton_experts.py``: row tiles that never straddle two experts, from the same
``tile_table``; a gate/up launch that stores ``silu(gate) * up``, then a down launch), with
the expert weights kept as DeepSeek-V3 stores them:

- ``w13 [E, 2I, H]`` e4m3 (gate rows, then up rows) with ``w13_scale_inv [E, 2 ceil(I/128),
  ceil(H/128)]``: the gate's block scales, then the up's (each projection's checkpoint scales
  stacked, so ``I`` need not be a multiple of 128);
- ``w2 [E, H, I]`` e4m3 with ``w2_scale_inv [E, ceil(H/128), ceil(I/128)]``.

Activations are quantized as the dense GEMM quantizes them (per row, per 128 inputs; see
``triton_fp8_gemm.py`` for why), but in registers as each 128-wide slice is loaded
(``quantize_rows``): the expert kernels read the hidden states and the intermediate
activations in their own dtype, and no quantized copy is written. Each program of a row tile
quantizes the same slices again; that is a few ALU operations per element against one FP8
``tl.dot`` per slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from roundgate.kernels.moe.triton_experts import tile_table
from roundgate.kernels.quant.fp8_blocks import (
    ACTIVATION_DTYPES,
    AMAX_FLOOR,
    BLOCK,
    FP8_DTYPE,
    FP8_MAX,
    dequantize_weight_blocks,
    num_blocks,
)
from roundgate.kernels.quant.triton_fp8_gemm import quantize_rows

BLOCK_M = 16
BLOCK_N = 64


@triton.jit
def _fp8_gate_up_silu_kernel(
    x_ptr,
    w13_ptr,
    s13_ptr,
    act_ptr,
    tile_expert_ptr,
    tile_start_ptr,
    tile_end_ptr,
    hidden,
    inter,
    up_scale_row,
    stride_x,
    stride_w_expert,
    stride_w_row,
    stride_s_expert,
    stride_s_row,
    stride_act,
    AMAX_FLOOR: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    tile = tl.program_id(0)
    col_block = tl.program_id(1)
    first, end = tl.load(tile_start_ptr + tile), tl.load(tile_end_ptr + tile)
    if first >= end:
        return  # an empty tile (a masked layout's unused rows): no weight read
    expert = tl.load(tile_expert_ptr + tile)
    rows = first + tl.arange(0, BLOCK_M)
    row_ok = rows < end
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    w_base = w13_ptr + expert * stride_w_expert
    s_base = s13_ptr + expert * stride_s_expert
    gate_scales = s_base + (cols // BLOCK_K) * stride_s_row
    up_scales = s_base + (up_scale_row + cols // BLOCK_K) * stride_s_row
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(0, tl.cdiv(hidden, BLOCK_K)):
        ks = step * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = ks < hidden
        x = tl.load(
            x_ptr + rows[:, None] * stride_x + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        xq, x_scale = quantize_rows(x.to(tl.float32), AMAX_FLOOR, FP8_MAX)
        w_mask = col_ok[:, None] & k_ok[None, :]
        w_gate = tl.load(
            w_base + cols[:, None] * stride_w_row + ks[None, :], mask=w_mask, other=0.0
        )
        w_up = tl.load(
            w_base + (cols + inter)[:, None] * stride_w_row + ks[None, :], mask=w_mask, other=0.0
        )
        gate_scale = tl.load(gate_scales + step, mask=col_ok, other=0.0)
        up_scale = tl.load(up_scales + step, mask=col_ok, other=0.0)
        gate += tl.dot(xq, tl.trans(w_gate)) * x_scale[:, None] * gate_scale[None, :]
        up += tl.dot(xq, tl.trans(w_up)) * x_scale[:, None] * up_scale[None, :]
    act = gate * tl.sigmoid(gate) * up  # silu(gate) * up
    tl.store(
        act_ptr + rows[:, None] * stride_act + cols[None, :],
        act.to(act_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


@triton.jit
def _fp8_down_kernel(
    act_ptr,
    w2_ptr,
    s2_ptr,
    out_ptr,
    tile_expert_ptr,
    tile_start_ptr,
    tile_end_ptr,
    hidden,
    inter,
    stride_act,
    stride_w_expert,
    stride_w_row,
    stride_s_expert,
    stride_s_row,
    stride_out,
    AMAX_FLOOR: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    tile = tl.program_id(0)
    col_block = tl.program_id(1)
    first, end = tl.load(tile_start_ptr + tile), tl.load(tile_end_ptr + tile)
    if first >= end:
        return  # an empty tile (a masked layout's unused rows): no weight read
    expert = tl.load(tile_expert_ptr + tile)
    rows = first + tl.arange(0, BLOCK_M)
    row_ok = rows < end
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    w_base = w2_ptr + expert * stride_w_expert
    w_scales = s2_ptr + expert * stride_s_expert + (cols // BLOCK_K) * stride_s_row
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(0, tl.cdiv(inter, BLOCK_K)):
        ks = step * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = ks < inter
        a = tl.load(
            act_ptr + rows[:, None] * stride_act + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        aq, a_scale = quantize_rows(a.to(tl.float32), AMAX_FLOOR, FP8_MAX)
        w = tl.load(
            w_base + cols[:, None] * stride_w_row + ks[None, :],
            mask=col_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w_scale = tl.load(w_scales + step, mask=col_ok, other=0.0)
        acc += tl.dot(aq, tl.trans(w)) * a_scale[:, None] * w_scale[None, :]
    tl.store(
        out_ptr + rows[:, None] * stride_out + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


def rows_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when its last two dims are laid out row after row (what the kernels
    index: a stride per expert and per row, columns adjacent), else a contiguous copy. The
    model's experts are views into byte rows (``fp8_expert_rows``): copying them for each
    call would move every expert weight of the rank."""
    rows, cols = tensor.shape[-2:]
    if tensor.stride(-1) == 1 and (rows == 1 or tensor.stride(-2) == cols):
        return tensor
    return tensor.contiguous()


def check_fp8_experts(
    w13: torch.Tensor, w13_scale_inv: torch.Tensor, w2: torch.Tensor, w2_scale_inv: torch.Tensor
) -> None:
    """Refuse expert weights off the layout above (``ValueError`` naming the tensor)."""
    if w13.dtype != FP8_DTYPE or w2.dtype != FP8_DTYPE or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"FP8 experts: w13 and w2 must be 3-D {FP8_DTYPE}")
    experts, hidden, inter = w2.shape
    if tuple(w13.shape) != (experts, 2 * inter, hidden):
        raise ValueError(
            f"FP8 experts: w13 {list(w13.shape)} does not match w2 {list(w2.shape)} "
            f"(expected [{experts}, {2 * inter}, {hidden}])"
        )
    wanted = {
        "w13_scale_inv": (w13_scale_inv, (experts, 2 * num_blocks(inter), num_blocks(hidden))),
        "w2_scale_inv": (w2_scale_inv, (experts, num_blocks(hidden), num_blocks(inter))),
    }
    for name, (scales, shape) in wanted.items():
        if scales.dtype != torch.float32 or tuple(scales.shape) != shape:
            raise ValueError(
                f"FP8 experts: {name} must be float32 {list(shape)}, got {scales.dtype} "
                f"{list(scales.shape)}"
            )


def dequantize_experts(
    w13: torch.Tensor, w13_scale_inv: torch.Tensor, w2: torch.Tensor, w2_scale_inv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 ``(w13, w2)`` these FP8 experts stand for (``run_experts``' weights)."""
    check_fp8_experts(w13, w13_scale_inv, w2, w2_scale_inv)
    inter = w2.shape[2]
    split = num_blocks(inter)
    gate_up = [
        torch.cat(
            [
                dequantize_weight_blocks(w[:inter], s[:split]),
                dequantize_weight_blocks(w[inter:], s[split:]),
            ]
        )
        for w, s in zip(w13, w13_scale_inv, strict=True)
    ]
    down = [dequantize_weight_blocks(w, s) for w, s in zip(w2, w2_scale_inv, strict=True)]
    return torch.stack(gate_up), torch.stack(down)


@dataclass(frozen=True)
class RowTiles:
    """The row tiles of grouped rows (``tile_table``): each tile's expert and row range."""

    expert: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor

    @staticmethod
    def of(counts: list[int], device: torch.device | str) -> RowTiles:
        return RowTiles(*tile_table(counts, BLOCK_M, device))

    @property
    def num_tiles(self) -> int:
        return self.expert.shape[0]


def fp8_gate_up(
    hidden: torch.Tensor, tiles: RowTiles, w13: torch.Tensor, w13_scale_inv: torch.Tensor
) -> torch.Tensor:
    """``silu(x @ gate^T) * (x @ up^T)`` of each tile's expert, in ``hidden``'s dtype
    (``[rows, I]``): the first of the two launches."""
    rows, size = hidden.shape
    inter = w13.shape[1] // 2
    act = hidden.new_empty(rows, inter)
    if rows == 0 or tiles.num_tiles == 0:
        return act
    hidden, w13, s13 = hidden.contiguous(), rows_contiguous(w13), rows_contiguous(w13_scale_inv)
    _fp8_gate_up_silu_kernel[(tiles.num_tiles, triton.cdiv(inter, BLOCK_N))](
        hidden,
        w13,
        s13,
        act,
        tiles.expert,
        tiles.start,
        tiles.end,
        size,
        inter,
        num_blocks(inter),
        hidden.stride(0),
        w13.stride(0),
        w13.stride(1),
        s13.stride(0),
        s13.stride(1),
        act.stride(0),
        AMAX_FLOOR=AMAX_FLOOR,
        FP8_MAX=FP8_MAX,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK,
    )
    return act


def fp8_down(
    act: torch.Tensor, tiles: RowTiles, w2: torch.Tensor, w2_scale_inv: torch.Tensor
) -> torch.Tensor:
    """``act @ w2^T`` of each tile's expert, in ``act``'s dtype (``[rows, H]``): the second
    launch."""
    rows, inter = act.shape
    size = w2.shape[1]
    out = act.new_empty(rows, size)
    if rows == 0 or tiles.num_tiles == 0:
        return out
    act, w2, s2 = act.contiguous(), rows_contiguous(w2), rows_contiguous(w2_scale_inv)
    _fp8_down_kernel[(tiles.num_tiles, triton.cdiv(size, BLOCK_N))](
        act,
        w2,
        s2,
        out,
        tiles.expert,
        tiles.start,
        tiles.end,
        size,
        inter,
        act.stride(0),
        w2.stride(0),
        w2.stride(1),
        s2.stride(0),
        s2.stride(1),
        out.stride(0),
        AMAX_FLOOR=AMAX_FLOOR,
        FP8_MAX=FP8_MAX,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK,
    )
    return out


def fp8_run_experts(
    hidden: torch.Tensor,
    counts: list[int],
    w13: torch.Tensor,
    w13_scale_inv: torch.Tensor,
    w2: torch.Tensor,
    w2_scale_inv: torch.Tensor,
) -> torch.Tensor:
    """SwiGLU experts over grouped rows (``run_experts``' contract) with FP8 expert weights."""
    check_fp8_experts(w13, w13_scale_inv, w2, w2_scale_inv)
    rows, size = hidden.shape
    if hidden.dtype not in ACTIVATION_DTYPES or size != w2.shape[1]:
        raise ValueError(
            f"FP8 experts: hidden {hidden.dtype} {list(hidden.shape)} for experts of hidden "
            f"size {w2.shape[1]} (bf16/fp16/fp32)"
        )
    if sum(counts) != rows or len(counts) != w13.shape[0]:
        raise ValueError(
            f"expert counts {counts} do not match {rows} rows and {w13.shape[0]} local experts"
        )
    tiles = RowTiles.of(counts, hidden.device)
    return fp8_down(fp8_gate_up(hidden, tiles, w13, w13_scale_inv), tiles, w2, w2_scale_inv)


def masked_tiles(counts: torch.Tensor, rows: int) -> RowTiles:
    """The row tiles of a masked layout (``[E, rows, H]`` flattened, expert ``e``'s first
    ``counts[e]`` rows valid; ``counts`` on the device): every expert's ``ceil(rows /
    BLOCK_M)`` tiles, each ending at the valid rows' end, so tiles past it are empty (their
    programs return at once). Built on the device: no count is read back."""
    experts = counts.shape[0]
    per_expert = -(-rows // BLOCK_M)
    index = torch.arange(experts * per_expert, device=counts.device)
    expert, within = index // per_expert, (index % per_expert) * BLOCK_M
    valid = (counts.to(torch.long)[expert] - within).clamp(0, BLOCK_M)
    start = expert * rows + within
    return RowTiles(expert, start, start + valid)


def masked_fp8_experts(
    packed: torch.Tensor,
    counts: torch.Tensor,
    w13: torch.Tensor,
    w13_scale_inv: torch.Tensor,
    w2: torch.Tensor,
    w2_scale_inv: torch.Tensor,
) -> torch.Tensor:
    """``masked_experts`` (``kernels/moe/triton_fused_moe.py``) over FP8 expert weights:
    DeepEP's low-latency layout ``packed [E, M, H]`` with its device ``counts`` in, each
    valid row's unweighted output out (``[E, M, H]``, rows past the counts unspecified)."""
    check_fp8_experts(w13, w13_scale_inv, w2, w2_scale_inv)
    experts, rows, size = packed.shape
    if counts.shape != (experts,) or w13.shape[0] != experts:
        raise ValueError(
            f"counts {tuple(counts.shape)} and w13 {tuple(w13.shape)} must have the "
            f"{experts} local experts of packed {tuple(packed.shape)}"
        )
    tiles = masked_tiles(counts, rows)
    flat = packed.reshape(experts * rows, size)
    out = fp8_down(fp8_gate_up(flat, tiles, w13, w13_scale_inv), tiles, w2, w2_scale_inv)
    return out.view(experts, rows, size)
