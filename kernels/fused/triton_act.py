"""SwiGLU's activation, ``silu(gate) * up``, as one Triton launch.

The MLPs keep gate and up fused (one GEMM writes ``[T, 2I]``, gate first); torch then spells
the activation as a chunk, a SiLU and a multiply, three dispatches and a ``[T, I]``
temporary. Here one launch reads both halves and writes the product, with torch's
arithmetic: SiLU as ``g / (1 + exp(-g))`` in float32 (torch's op math for every float dtype),
rounded to the input's dtype, then the product rounded once more.

Grid: (token, block of ``BLOCK`` columns), so a one-token decode still spreads DeepSeek-V3's
18432-wide dense MLP over 18 programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roundgate.kernels.triton_env import tile_width

# Columns a program covers; 4 warps then hold 8 values a thread of each half.
MAX_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(
    gate_up_ptr,
    out_ptr,
    inter,
    stride_in,
    stride_out,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    in_row = gate_up_ptr + row * stride_in
    gate = tl.load(in_row + cols, mask=mask, other=0.0)
    up = tl.load(in_row + inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    out = (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` for ``gate, up = gate_up.chunk(2, -1)``, ``gate_up [T, 2I]``:
    ``[T, I]`` in one launch, 2 ops (the output, the launch)."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be [T, 2I], got {list(gate_up.shape)}")
    if gate_up.stride(1) != 1:
        gate_up = gate_up.contiguous()
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    if rows and inter:
        block = min(tile_width(inter, 1), MAX_BLOCK)
        grid = (rows, triton.cdiv(inter, block))
        _silu_mul_kernel[grid](gate_up, out, inter, gate_up.stride(0), out.stride(0), BLOCK=block)
    return out
