"""Block-scaled FP8 (e4m3) arithmetic in plain torch: the format, its quantizers, references.

DeepSeek-V3's checkpoints store each linear weight ``W [N, K]`` as float8_e4m3fn codes with one
float32 ``scale_inv`` per 128x128 block (``[ceil(N/128), ceil(K/128)]``; edge blocks may be
partial): the real weight is ``code * scale_inv[n // 128, k // 128]``. The model was trained
with activations quantized the matching way, one scale per token per 128 inputs (a 1x128
group), so a product of two FP8 operands needs only one float32 rescale per 128-wide slice
of ``K`` -- the layout the Triton kernel (``triton_fp8_gemm.py``) computes in.

Here, without Triton:

- ``quantize_activations``: ``x [M, K]`` to e4m3 codes and ``[M, ceil(K/128)]`` scales, the
  kernel's quantize step written in torch (the same operations, so the same codes);
- ``quantize_weight_blocks``: a float weight to codes and 128x128 scales (tests and tools build
  FP8 weights with it; checkpoints arrive already quantized);
- ``dequantized_linear``: ``x @ dequantize(W)^T`` with ``x`` left as it is: the CPU path, and
  the product the FP8 one approximates;
- ``fp8_gemm_reference``: ``dequantize(quantize(x)) @ dequantize(W)^T``: what the kernel
  computes, summation order aside.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK = 128  # weight blocks are BLOCK x BLOCK; activation groups are 1 x BLOCK
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value: a group's largest magnitude maps onto it
# An all-zero group would divide 0 by 0; its amax is floored here, so its codes are all zero.
AMAX_FLOOR = 1e-10
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class QuantizedActivations:
    """``x [M, K]`` as e4m3 codes and one float32 scale per row per 128 columns:
    ``x[m, k] ~= values[m, k] * scales[m, k // 128]``."""

    values: torch.Tensor  # [M, K] float8_e4m3fn
    scales: torch.Tensor  # [M, ceil(K / 128)] float32

    def dequantize(self) -> torch.Tensor:
        """The float32 activations these codes stand for."""
        k = self.values.shape[1]
        return self.values.float() * self.scales.repeat_interleave(BLOCK, 1)[:, :k]


def num_blocks(size: int) -> int:
    """How many 128-wide blocks cover ``size`` (the last may be partial)."""
    return -(-size // BLOCK)


def check_fp8_weight(weight: torch.Tensor, scale_inv: torch.Tensor) -> None:
    """Refuse anything but e4m3 ``[N, K]`` codes with float32 ``[ceil(N/128), ceil(K/128)]``
    block scales (``ValueError`` naming the tensor at fault)."""
    if weight.dtype != FP8_DTYPE or weight.dim() != 2:
        raise ValueError(
            f"FP8 weight: expected a 2-D {FP8_DTYPE} tensor, got {weight.dim()}-D {weight.dtype}"
        )
    n, k = weight.shape
    grid = (num_blocks(n), num_blocks(k))
    if scale_inv.dtype != torch.float32 or tuple(scale_inv.shape) != grid:
        raise ValueError(
            f"FP8 weight_scale_inv: a [{n}, {k}] weight needs float32 scales of shape "
            f"{list(grid)} (one per {BLOCK}x{BLOCK} block), got {scale_inv.dtype} "
            f"{list(scale_inv.shape)}"
        )


def quantize_activations(x: torch.Tensor) -> QuantizedActivations:
    """Per token, per 128 columns: ``scale = max(amax, floor) / 448``, ``code = rne(x /
    scale)`` clamped to +-448 (the Triton quantize step's operations, in float32)."""
    if x.dim() != 2 or x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"activations: expected 2-D bf16/fp16/fp32, got {x.dim()}-D {x.dtype}")
    m, k = x.shape
    groups = num_blocks(k)
    padded = F.pad(x.float(), (0, groups * BLOCK - k)).view(m, groups, BLOCK)
    scales = padded.abs().amax(dim=-1).clamp_min(AMAX_FLOOR) / FP8_MAX
    codes = (padded / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return QuantizedActivations(codes.view(m, groups * BLOCK)[:, :k].contiguous(), scales)


def quantize_weight_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes [N, K] e4m3, scale_inv [ceil(N/128), ceil(K/128)] float32)`` with each
    128x128 block's largest magnitude mapped onto 448 (DeepSeek-V3's weight layout)."""
    if weight.dim() != 2:
        raise ValueError(f"weight: expected 2-D, got {weight.dim()}-D")
    n, k = weight.shape
    rows, cols = num_blocks(n), num_blocks(k)
    padded = F.pad(weight.float(), (0, cols * BLOCK - k, 0, rows * BLOCK - n))
    blocks = padded.view(rows, BLOCK, cols, BLOCK)
    scale_inv = blocks.abs().amax(dim=(1, 3)).clamp_min(AMAX_FLOOR) / FP8_MAX
    codes = (blocks / scale_inv[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes.view(rows * BLOCK, cols * BLOCK)[:n, :k].contiguous(), scale_inv


def dequantize_weight_blocks(weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """The float32 weight: each code times its 128x128 block's scale."""
    check_fp8_weight(weight, scale_inv)
    n, k = weight.shape
    spread = scale_inv.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return weight.float() * spread


def dequantized_linear(
    x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor
) -> torch.Tensor:
    """``x @ dequantize(W)^T`` in float32, ``x`` unquantized (``[..., K] -> [..., N]``)."""
    return F.linear(x.float(), dequantize_weight_blocks(weight, scale_inv))


def fp8_gemm_reference(
    x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor
) -> torch.Tensor:
    """The FP8 GEMM's product in float32: ``x`` (2-D) quantized as the kernel does, then both
    operands dequantized and multiplied."""
    return F.linear(
        quantize_activations(x).dequantize(), dequantize_weight_blocks(weight, scale_inv)
    )
