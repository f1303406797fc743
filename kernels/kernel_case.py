"""One Triton kernel at one shape, as a launch would compile it: what the sm_90 report
(``kernels/sm90_report.py``) compiles, built from meta tensors (shapes, no memory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class KernelCase:
    """One kernel at one shape: the arguments and launch options a launcher would pass."""

    name: str
    shape: str  # what the shape is, for the table
    kernel: Any  # the triton.jit function
    args: tuple[Any, ...]  # runtime arguments: meta tensors, ints, floats
    constexprs: dict[str, int] = field(default_factory=dict)
    num_warps: int = 4  # Triton's launch defaults, which the project's launchers keep
    num_stages: int = 3


def meta_tensor(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A tensor with a shape, strides and dtype but no memory (only its metadata is read)."""
    return torch.empty(shape, dtype=dtype, device="meta")
