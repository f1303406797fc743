"""FP8 block-scaled checkpoints (DeepSeek-V3's format), dequantized once at load.

``quantization_config = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [R, C]}``:
each FP8 (e4m3) weight ``W [rows, cols]`` comes with ``W_scale_inv [ceil(rows/R), ceil(cols/C)]``
and the real weight is ``W[i, j] * scale_inv[i // R, j // C]``. The engine computes in the
runtime dtype, so weights are dequantized as they are read; what that costs over the FP8
file is logged once when the checkpoint is opened.
"""

from __future__ import annotations

import logging

import torch

from roundgate.actors.model.weights import SafetensorsSource

logger = logging.getLogger(__name__)

FP8_DTYPE = "F8_E4M3"


def dequantize_blocks(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """``weight * scale_inv`` with each scale spread over its ``block`` (edges may be partial)."""
    rows, cols = weight.shape
    expanded = scale_inv.float().repeat_interleave(block[0], 0)[:rows]
    expanded = expanded.repeat_interleave(block[1], 1)[:, :cols]
    return weight.float() * expanded


class BlockFP8Source:
    """A TensorSource that dequantizes the FP8 tensors of ``inner`` with their block scales."""

    def __init__(self, inner: SafetensorsSource, block: tuple[int, int]) -> None:
        self.inner, self.block = inner, block
        fp8 = [n for n, dtype in inner.dtypes.items() if dtype == FP8_DTYPE]
        unscaled = [n for n in fp8 if not inner.has(n + "_scale_inv")]
        if unscaled:
            raise ValueError(
                f"{inner.model_dir}: FP8 tensor {unscaled[0]!r} has no {unscaled[0]}_scale_inv"
            )
        self.num_fp8 = len(fp8)
        self.fp8_bytes = sum(inner.numels[n] for n in fp8)  # one byte an element
        logger.info(
            "FP8 block-scaled checkpoint %s: %d FP8 tensors (%dx%d blocks), %.3f GiB as FP8; "
            "dequantized at load they take %.3f GiB in bf16 or %.3f GiB in float32",
            inner.model_dir,
            len(fp8),
            *block,
            self.fp8_bytes / 2**30,
            2 * self.fp8_bytes / 2**30,
            4 * self.fp8_bytes / 2**30,
        )

    def has(self, name: str) -> bool:
        return self.inner.has(name)

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        tensor = self.inner.get(name, shape)
        if tensor.dtype != torch.float8_e4m3fn:
            return tensor
        rows, cols = shape
        grid = (-(-rows // self.block[0]), -(-cols // self.block[1]))
        scale = self.inner.get(name + "_scale_inv", grid)
        return dequantize_blocks(tensor, scale, self.block)
