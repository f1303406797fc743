"""FP8 block-scaled checkpoints (DeepSeek-V3's format): dequantized at load, or kept as FP8.

``quantization_config = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [R, C]}``:
each FP8 (e4m3) weight ``W [rows, cols]`` comes with ``W_scale_inv [ceil(rows/R), ceil(cols/C)]``
and the real weight is ``W[i, j] * scale_inv[i // R, j // C]``.

``--fp8-weights`` says what the loader does with them:

- ``dequantize``: every weight is dequantized as it is read (``get``) and the engine computes
  in the runtime dtype: the CPU path, and what ``auto`` means off CUDA;
- ``keep``: the projections a module can run in FP8 (``Fp8Linear``; the routed experts) read
  the codes and their scales as stored (``get_fp8``), one byte a weight; the rest (MLA's
  ``kv_b_proj``, absorbed per head; anything not stored FP8) is still dequantized. Needs
  128x128 blocks, the GEMM's;
- ``auto``: ``keep`` on CUDA with 128x128 blocks, else ``dequantize``.

The decision is the source's (``keep_fp8``): modules ask it, so one flag reaches every layer's
``load`` without each taking a new argument.
"""

from __future__ import annotations

import copy
import logging
from typing import NamedTuple

import torch

from roundgate.actors.model.weights import SafetensorsSource

logger = logging.getLogger(__name__)

FP8_DTYPE = "F8_E4M3"
FP8_WEIGHTS_FLAG = "--fp8-weights"
# The block the FP8 GEMM and experts kernels are written for (``kernels/quant/fp8_blocks.py``).
KERNEL_BLOCK = (128, 128)


class Fp8Tensor(NamedTuple):
    """A weight as the checkpoint stores it: e4m3 codes and float32 block scales."""

    codes: torch.Tensor  # [rows, cols] float8_e4m3fn
    scale_inv: torch.Tensor  # [ceil(rows / R), ceil(cols / C)] float32


def keeps_fp8(mode: str, device: torch.device | str, block: tuple[int, int]) -> bool:
    """Whether ``--fp8-weights mode`` keeps a checkpoint of ``block`` scales FP8 on ``device``
    (``ValueError`` naming the flag for ``keep`` with blocks the kernels do not take)."""
    if mode not in ("auto", "keep", "dequantize"):
        raise ValueError(f"{FP8_WEIGHTS_FLAG} must be one of auto, keep, dequantize, got {mode!r}")
    if mode == "keep" and tuple(block) != KERNEL_BLOCK:
        raise ValueError(
            f"{FP8_WEIGHTS_FLAG} keep: the checkpoint's blocks are {block[0]}x{block[1]}; the "
            "FP8 kernels take 128x128 (use auto or dequantize)"
        )
    kind = getattr(device, "type", str(device).partition(":")[0])
    return mode == "keep" or (mode == "auto" and kind == "cuda" and tuple(block) == KERNEL_BLOCK)


def dequantize_blocks(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """``weight * scale_inv`` with each scale spread over its ``block`` (edges may be partial)."""
    rows, cols = weight.shape
    expanded = scale_inv.float().repeat_interleave(block[0], 0)[:rows]
    expanded = expanded.repeat_interleave(block[1], 1)[:, :cols]
    return weight.float() * expanded


class BlockFP8Source:
    """A TensorSource over ``inner`` whose ``get`` dequantizes the FP8 tensors with their block
    scales, and whose ``get_fp8`` hands them over as stored; ``keep_fp8`` tells the modules
    which of the two to read (``--fp8-weights``; ``auto`` reads as dequantize until
    ``for_device`` resolves it)."""

    def __init__(
        self, inner: SafetensorsSource, block: tuple[int, int], fp8_weights: str = "dequantize"
    ) -> None:
        self.inner, self.block = inner, block
        self.fp8_weights = fp8_weights
        self.keep_fp8 = keeps_fp8(fp8_weights, "cpu", block)  # ``auto`` is the device's
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
            "dequantized at load they take %.3f GiB in bf16 or %.3f GiB in float32 "
            "(--fp8-weights %s)",
            inner.model_dir,
            len(fp8),
            *block,
            self.fp8_bytes / 2**30,
            2 * self.fp8_bytes / 2**30,
            4 * self.fp8_bytes / 2**30,
            fp8_weights,
        )

    def for_device(self, device: torch.device | str) -> BlockFP8Source:
        """This source with ``--fp8-weights auto`` resolved for ``device`` (the same files;
        nothing is read again); itself when the choice was explicit."""
        if self.fp8_weights != "auto":
            return self
        resolved = copy.copy(self)
        resolved.keep_fp8 = keeps_fp8("auto", device, self.block)
        resolved.fp8_weights = "keep" if resolved.keep_fp8 else "dequantize"
        logger.info(
            "FP8 block-scaled checkpoint %s on %s: --fp8-weights auto -> %s",
            self.inner.model_dir,
            device,
            resolved.fp8_weights,
        )
        return resolved

    def has(self, name: str) -> bool:
        return self.inner.has(name)

    def is_fp8(self, name: str) -> bool:
        """Whether ``name`` is stored as FP8 codes (with a ``_scale_inv`` beside it)."""
        return self.inner.dtypes.get(name) == FP8_DTYPE

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        stored = self.get_fp8(name, shape)
        if stored is None:
            return self.inner.get(name, shape)
        return dequantize_blocks(stored.codes, stored.scale_inv, self.block)

    def get_fp8(self, name: str, shape: tuple[int, ...]) -> Fp8Tensor | None:
        """``name``'s codes and block scales as stored; None for a tensor not stored FP8."""
        if not self.is_fp8(name):
            return None
        codes = self.inner.get(name, shape)
        rows, cols = shape
        grid = (-(-rows // self.block[0]), -(-cols // self.block[1]))
        return Fp8Tensor(codes, self.inner.get(name + "_scale_inv", grid).float())


def kept_fp8(source: object, name: str, shape: tuple[int, ...]) -> Fp8Tensor | None:
    """``name`` as stored when ``source`` keeps FP8 and holds it as FP8; else None (read it
    with ``get``, dequantized)."""
    if not getattr(source, "keep_fp8", False):
        return None
    return stored_fp8(source, name, shape)


def stored_fp8(source: object, name: str, shape: tuple[int, ...]) -> Fp8Tensor | None:
    """``name`` as stored when it is FP8, whatever ``source`` keeps (re-homed experts go back
    into FP8 slots); None for a source or a tensor without FP8."""
    get_fp8 = getattr(source, "get_fp8", None)
    return None if get_fp8 is None else get_fp8(name, shape)
