"""A linear layer that keeps a block-scaled FP8 weight as FP8 (one byte a weight plus its scales).

``Fp8Linear`` holds a checkpoint's ``weight`` (e4m3 ``[N, K]``) and ``weight_scale_inv``
(float32, one per 128x128 block) under the checkpoint's own names, so a DeepSeek-V3 state dict
loads into it as it is. On CUDA its product is the Triton block-FP8 GEMM
(``triton_fp8_gemm.fp8_block_gemm``: activations quantized per token per 128 columns, as the
model was trained). Elsewhere it dequantizes the weight for each call and multiplies in float32:
correct but slow, for tests and tools; a CPU deployment keeps dequantizing once at load
(``actors/model/fp8.py``) and uses a plain ``nn.Linear``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from roundgate.kernels.quant.fp8_blocks import check_fp8_weight, dequantized_linear


class Fp8Linear(nn.Module):
    """``y = x @ W^T`` (no bias) over an FP8 weight kept in its 128x128 block-scaled form.

    ``use_kernel``: None runs the Triton GEMM exactly when ``x`` is on CUDA; True forces it
    (on a CPU that needs ``TRITON_INTERPRET=1``: how the tests run it); False never runs it.
    """

    def __init__(
        self, weight: torch.Tensor, weight_scale_inv: torch.Tensor, use_kernel: bool | None = None
    ) -> None:
        super().__init__()
        check_fp8_weight(weight, weight_scale_inv)
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale_inv", weight_scale_inv)
        self.use_kernel = use_kernel
        self.out_features, self.in_features = weight.shape
        self.bias: torch.Tensor | None = None  # nn.Linear's interface; FP8 layers have none

    @property
    def nbytes(self) -> int:
        """Bytes held: one a weight, four a block scale."""
        return self.weight.numel() + 4 * self.weight_scale_inv.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"Fp8Linear: x has {x.shape[-1]} features, expected {self.in_features}"
            )
        use_kernel = x.is_cuda if self.use_kernel is None else self.use_kernel
        if use_kernel:
            # Imported here: a CPU process that never runs the kernel never imports triton.
            from roundgate.kernels.quant.triton_fp8_gemm import fp8_block_gemm

            return fp8_block_gemm(x, self.weight, self.weight_scale_inv)
        return dequantized_linear(x, self.weight, self.weight_scale_inv).to(x.dtype)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Fp8Linear:
        """Moves follow the module, casts do not: ``model.to(torch.bfloat16)`` would turn the
        e4m3 codes into bf16 numbers and round the float32 scales, so only the device that
        ``fn`` sends a tensor to is taken from it."""
        device = fn(self.weight_scale_inv.new_empty(0)).device
        for name in ("weight", "weight_scale_inv"):
            self._buffers[name] = self._buffers[name].to(device)  # type: ignore[union-attr]
        return self

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, fp8 e4m3 128x128 blocks"
