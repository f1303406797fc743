"""RMSNorm, and the residual add that precedes it, as one Triton launch each.

The torch layer (``RMSNorm.forward`` in ``actors/model/layers.py``) spells a norm as an
upcast, ``F.rms_norm``, a downcast and a multiply by the weight; with the residual add before
it, a layer's two norms cost about ten dispatches. Here each is one launch (plus the output's
allocation), with the same arithmetic: the row in float32, ``x * rsqrt(mean(x^2) + eps)``,
rounded to ``x``'s dtype, then multiplied by the weight, that product rounded once to ``x``'s
dtype as torch rounds it. Only the sum of squares is added in another order (a tree, not
torch's), so float32 results agree to rounding.

One program per row. A row of up to ``MAX_BLOCK`` values (DeepSeek-V3's hidden 7168 is one
block of 8192) stays in registers between the sum of squares and the scaling; a wider row is
walked twice in blocks, recomputing ``residual + x`` on the second walk rather than reading
back what the first one stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roundgate.kernels.triton_env import tile_width

# The widest row kept whole in registers (16 warps: 32 float32 values a thread).
MAX_BLOCK = 16384


@triton.jit
def _summed_row(x_ptr, res_ptr, offs, mask, HAS_RESIDUAL: tl.constexpr):
    """The row's values in ``x``'s dtype: ``x``, or ``residual + x`` rounded to that dtype."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + offs, mask=mask, other=0.0)
        x = (res.to(tl.float32) + x.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _scaled(x, rstd, weight):
    """``weight * (x * rstd)``, each product rounded to ``x``'s dtype as torch rounds it."""
    normed = (x.to(tl.float32) * rstd).to(x.dtype)
    return (normed.to(tl.float32) * weight.to(tl.float32)).to(x.dtype)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    weight_ptr,
    out_ptr,
    summed_ptr,
    eps,
    stride_x,
    stride_res,
    stride_out,
    stride_summed,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    res_row = res_ptr + row * stride_res
    out_row = out_ptr + row * stride_out
    summed_row = summed_ptr + row * stride_summed
    cols = tl.arange(0, BLOCK)
    if D <= BLOCK:
        mask = cols < D
        x = _summed_row(x_row, res_row, cols, mask, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            tl.store(summed_row + cols, x, mask=mask)
        xf = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
        weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
        tl.store(out_row + cols, _scaled(x, rstd, weight), mask=mask)
    else:
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, D, BLOCK):
            offs = start + cols
            mask = offs < D
            x = _summed_row(x_row, res_row, offs, mask, HAS_RESIDUAL)
            if HAS_RESIDUAL:
                tl.store(summed_row + offs, x, mask=mask)
            xf = x.to(tl.float32)
            squares += xf * xf
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / D + eps)
        for start in range(0, D, BLOCK):
            offs = start + cols
            mask = offs < D
            x = _summed_row(x_row, res_row, offs, mask, HAS_RESIDUAL)
            weight = tl.load(weight_ptr + offs, mask=mask, other=0.0)
            tl.store(out_row + offs, _scaled(x, rstd, weight), mask=mask)


def _num_warps(block: int) -> int:
    """Enough warps that a thread holds at most 16-32 values of the row."""
    return 4 if block <= 2048 else 8 if block <= 4096 else 16


def _check_rows(name: str, x: torch.Tensor, width: int) -> None:
    if x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"{name} must be [T, {width}], got {list(x.shape)}")


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    summed: torch.Tensor | None,
) -> None:
    rows, width = x.shape
    block = min(tile_width(width, 1), MAX_BLOCK)
    # Without a residual the kernel never touches these (HAS_RESIDUAL is a constexpr), so
    # ``x`` and ``out`` stand in for them rather than allocating placeholders.
    res = x if residual is None else residual
    summed_out = out if summed is None else summed
    _rms_norm_kernel[(rows,)](
        x,
        res,
        weight,
        out,
        summed_out,
        eps,
        x.stride(0),
        res.stride(0),
        out.stride(0),
        summed_out.stride(0),
        D=width,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        num_warps=_num_warps(block),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``RMSNorm.forward`` of ``x [T, D]`` in one launch: 2 ops (the output, the launch).

    ``x`` is copied only when its last dim is strided; any row stride is read as it is.
    """
    _check_rows("x", x, weight.shape[0])
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        _launch(x, None, weight, eps, out, None)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(RMSNorm(residual + x), residual + x)`` as new tensors, in one launch: 3 ops.

    Normed first, then the sum (vLLM's order for its fused add-norm). The sum is the block's
    next residual, so it is written out beside the normed row instead of being recomputed;
    neither input is modified (a captured graph may still read them).
    """
    _check_rows("x", x, weight.shape[0])
    _check_rows("residual", residual, weight.shape[0])
    if x.stride(1) != 1:
        x = x.contiguous()
    if residual.stride(1) != 1:
        residual = residual.contiguous()
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    normed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        _launch(x, residual, weight, eps, normed, summed)
    return normed, summed
