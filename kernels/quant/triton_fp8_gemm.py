"""Block-FP8 GEMM in Triton: ``y = x @ W^T`` with ``W`` e4m3 in 128x128 scaled blocks.

Why the activations are quantized too (w8a8), not kept in bf16: DeepSeek-V3 was trained with
exactly this arithmetic (activations in 1x128 groups, weights in 128x128 blocks, FP8 products
rescaled to float32 every 128 inputs), so it is the model's own numerics, not an extra
approximation of them; and both ``tl.dot`` operands being e4m3 puts the product on sm_90's FP8
tensor cores (twice bf16's rate) with half the operand bytes in shared memory. Decode is bound
by reading ``W`` either way; the quantize step costs one pass over ``x``.

Two launches:

1. quantize: one program per (row, 128-column group) writes the group's e4m3 codes and its
   float32 scale (``fp8_blocks.quantize_activations`` is the same operations in torch; both
   divisions are IEEE round-to-nearest, ``tl.div_rn``, so scales and codes match torch's);
2. GEMM: one program per ``BLOCK_M x BLOCK_N`` tile of ``y`` walks ``K`` in steps of 128 --
   one weight block column and one activation group per step -- and adds each step's FP8
   ``tl.dot`` (float32 result) times the row scales and the column blocks' scales into a
   float32 accumulator. ``BLOCK_K`` is 128 so that one step never straddles two scales.

Every dimension is masked, so ``N`` and ``K`` need not be multiples of 128 (or of anything).

Tolerance (checked in ``tests/test_fp8_gemm.py`` under the interpreter): against
``fp8_blocks.fp8_gemm_reference`` the difference is float32 summation order only, within
``2 K u (|x_q| @ |W|^T)`` (``u = 2^-24``). Against the unquantized ``dequantized_linear``,
e4m3 rounds each activation to 3 mantissa bits: ``|x - x_q| <= 2^-4 |x| + 2^-10 s`` (the
second term covers codes in e4m3's subnormal range, ``s`` being the group's scale), hence
``|y - y_ref| <= (2^-4 |x| + 2^-10 s) @ |W|^T`` elementwise, plus the float32 term.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from roundgate.kernels.quant.fp8_blocks import (
    ACTIVATION_DTYPES,
    AMAX_FLOOR,
    BLOCK,
    FP8_DTYPE,
    FP8_MAX,
    QuantizedActivations,
    check_fp8_weight,
    num_blocks,
)


@dataclass(frozen=True)
class GemmTiles:
    """One launch configuration of the GEMM kernel."""

    block_m: int  # rows of x per program (16 is ``tl.dot``'s minimum)
    block_n: int  # output columns per program
    num_warps: int
    num_stages: int  # software-pipelined K steps in flight (shared memory grows with it)


# By rows of x: a decode's few rows take the smallest tile (more programs over N); prefill
# chunks take tiles that reuse each loaded block across more rows. Untuned starting points.
DECODE_TILES = GemmTiles(block_m=16, block_n=64, num_warps=4, num_stages=4)
SMALL_TILES = GemmTiles(block_m=64, block_n=128, num_warps=4, num_stages=3)
PREFILL_TILES = GemmTiles(block_m=128, block_n=128, num_warps=8, num_stages=3)


def gemm_tiles(rows: int) -> GemmTiles:
    """The tile configuration for ``rows`` rows of x."""
    if rows <= 16:
        return DECODE_TILES
    return SMALL_TILES if rows <= 64 else PREFILL_TILES


@triton.jit
def round_to_e4m3(v):
    """``v`` (float32, ``|v| <= 448``) rounded to the nearest e4m3 value, ties to even.

    The cast to e4m3 would round by itself on a GPU, but Triton 3.9's interpreter rounds it
    wrong (a mantissa that rounds up past 7 does not carry into the exponent: 124.3 becomes
    64, not 128); so the kernel rounds first and the cast only re-encodes an exact value.
    e4m3 keeps 3 mantissa bits: the step in ``v``'s binade is ``2^(e - 3)`` for exponent
    ``e``, and ``2^-9`` (the subnormal step) below the smallest normal binade (``e = -6``).
    Adding then subtracting ``1.5 * 2^23`` steps rounds ``|v|`` to a multiple of the step
    (float32's own round-to-nearest-even), for any ``|v|`` under ``2^22`` steps.
    """
    bits = v.to(tl.int32, bitcast=True)
    step_exponent = tl.maximum(((bits >> 23) & 0xFF) - 127, -6) - 3
    # 1.5 * 2^(step_exponent + 23) as float32 bits: the exponent field, the mantissa's top bit.
    magic = (((step_exponent + 23 + 127) << 23) | (1 << 22)).to(tl.float32, bitcast=True)
    rounded = (tl.abs(v) + magic) - magic
    # The sign goes back on as a bit, so that -0.0 and values rounding to zero keep theirs.
    return (rounded.to(tl.int32, bitcast=True) | (bits & -0x80000000)).to(tl.float32, bitcast=True)


@triton.jit
def quantize_rows(x, AMAX_FLOOR: tl.constexpr, FP8_MAX: tl.constexpr):
    """A float32 tile ``[rows, 128]`` (one activation group a row) as e4m3 codes and a float32
    scale per row: the quantize step done in registers, for kernels that quantize their
    operand as they load it (masked lanes must hold 0)."""
    scale = tl.div_rn(tl.maximum(tl.max(tl.abs(x), 1), AMAX_FLOOR), FP8_MAX)
    codes = round_to_e4m3(tl.clamp(tl.div_rn(x, scale[:, None]), -FP8_MAX, FP8_MAX))
    return codes.to(tl.float8e4nv), scale


@triton.jit
def _quantize_groups_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    cols,
    stride_x,
    stride_q,
    stride_s,
    AMAX_FLOOR: tl.constexpr,
    FP8_MAX: tl.constexpr,
    GROUP: tl.constexpr,
):
    row = tl.program_id(0)
    group = tl.program_id(1)
    ks = group * GROUP + tl.arange(0, GROUP)
    ok = ks < cols
    x = tl.load(x_ptr + row * stride_x + ks, mask=ok, other=0.0).to(tl.float32)
    scale = tl.div_rn(tl.maximum(tl.max(tl.abs(x), 0), AMAX_FLOOR), FP8_MAX)
    codes = round_to_e4m3(tl.clamp(tl.div_rn(x, scale), -FP8_MAX, FP8_MAX))
    tl.store(q_ptr + row * stride_q + ks, codes.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(scale_ptr + row * stride_s + group, scale)


@triton.jit
def _fp8_block_gemm_kernel(
    xq_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    y_ptr,
    rows,
    cols,
    depth,
    stride_xq,
    stride_xs,
    stride_w,
    stride_ws,
    stride_y,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = ms < rows
    n_ok = ns < cols
    # The weight block row of each output column (BLOCK_K is the block size).
    ws_row = (ns // BLOCK_K) * stride_ws
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(0, tl.cdiv(depth, BLOCK_K)):
        ks = step * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = ks < depth
        xq = tl.load(
            xq_ptr + ms[:, None] * stride_xq + ks[None, :],
            mask=m_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        wq = tl.load(
            w_ptr + ns[:, None] * stride_w + ks[None, :],
            mask=n_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        x_scale = tl.load(xs_ptr + ms * stride_xs + step, mask=m_ok, other=0.0)
        w_scale = tl.load(ws_ptr + ws_row + step, mask=n_ok, other=0.0)
        part = tl.dot(xq, tl.trans(wq))  # e4m3 x e4m3 -> float32
        acc += part * x_scale[:, None] * w_scale[None, :]
    tl.store(
        y_ptr + ms[:, None] * stride_y + ns[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=m_ok[:, None] & n_ok[None, :],
    )


def quantize_activations_triton(x: torch.Tensor) -> QuantizedActivations:
    """``fp8_blocks.quantize_activations`` as a Triton kernel (``x`` 2-D bf16/fp16/fp32)."""
    if x.dim() != 2 or x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"activations: expected 2-D bf16/fp16/fp32, got {x.dim()}-D {x.dtype}")
    x = x.contiguous()
    rows, cols = x.shape
    groups = num_blocks(cols)
    codes = torch.empty(rows, cols, dtype=FP8_DTYPE, device=x.device)
    scales = torch.empty(rows, groups, dtype=torch.float32, device=x.device)
    if rows and cols:
        _quantize_groups_kernel[(rows, groups)](
            x,
            codes,
            scales,
            cols,
            x.stride(0),
            codes.stride(0),
            scales.stride(0),
            AMAX_FLOOR=AMAX_FLOOR,
            FP8_MAX=FP8_MAX,
            GROUP=BLOCK,
        )
    return QuantizedActivations(codes, scales)


def fp8_block_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``x [..., K] @ W^T -> [..., N]`` for e4m3 ``W [N, K]`` with float32 128x128 block
    ``scale_inv``; ``x`` is quantized per token per 128 columns on the way (see the module
    docstring for why). The result is in ``out_dtype`` (default: ``x``'s dtype)."""
    check_fp8_weight(weight, scale_inv)
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"fp8_block_gemm: x has {x.shape[-1]} columns, the weight {k}")
    if weight.stride(1) != 1:
        raise ValueError("fp8_block_gemm: the weight's rows must be contiguous")
    lead = x.shape[:-1]
    quantized = quantize_activations_triton(x.reshape(-1, k))
    rows = quantized.values.shape[0]
    y = torch.empty(rows, n, dtype=out_dtype or x.dtype, device=x.device)
    if rows and n:
        tiles = gemm_tiles(rows)
        scale_inv = scale_inv.contiguous()
        grid = (triton.cdiv(rows, tiles.block_m), triton.cdiv(n, tiles.block_n))
        _fp8_block_gemm_kernel[grid](
            quantized.values,
            quantized.scales,
            weight,
            scale_inv,
            y,
            rows,
            n,
            k,
            quantized.values.stride(0),
            quantized.scales.stride(0),
            weight.stride(0),
            scale_inv.stride(0),
            y.stride(0),
            BLOCK_M=tiles.block_m,
            BLOCK_N=tiles.block_n,
            BLOCK_K=BLOCK,
            num_warps=tiles.num_warps,
            num_stages=tiles.num_stages,
        )
    return y.view(*lead, n)
