"""MoE expert dispatch/combine across the DP group (``--moe-backend``: ``local``, ``torch``,
``deepep``), and the expert computation between them (``--moe-kernel``: ``torch``, a GEMM pair
per expert, or ``triton``, fused grouped GEMMs); ``registry.py`` lists both.

Attention is data-parallel (each rank its own batch); experts are sharded over the same
ranks (``ExpertPlacement``), so every MoE layer is a group collective.

This file imports nothing heavy: ``registry`` is read where torch must not load
(``ServerArgs`` lists the choices in every process, the ingress included), and Python runs
this file first. The package's names load on first use instead (PEP 562), from the module
that defines each.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roundgate.kernels.moe.base import (
        Dispatched,
        ExpertsKernel,
        MoEBackend,
        group_by_expert,
        run_experts,
    )
    from roundgate.kernels.moe.local import LocalMoE
    from roundgate.kernels.moe.placement import ExpertPlacement
    from roundgate.kernels.moe.registry import build_backend as select_moe_backend
    from roundgate.kernels.moe.registry import experts_kernel as select_experts_kernel
    from roundgate.kernels.moe.registry import resolve_backend as resolve_moe_backend
    from roundgate.kernels.moe.torch_a2a import TorchAllToAllMoE

# Each name -> (its module in this package, its name there).
_EXPORTS = {
    "Dispatched": ("base", "Dispatched"),
    "ExpertsKernel": ("base", "ExpertsKernel"),
    "MoEBackend": ("base", "MoEBackend"),
    "group_by_expert": ("base", "group_by_expert"),
    "run_experts": ("base", "run_experts"),
    "LocalMoE": ("local", "LocalMoE"),
    "ExpertPlacement": ("placement", "ExpertPlacement"),
    "TorchAllToAllMoE": ("torch_a2a", "TorchAllToAllMoE"),
    "resolve_moe_backend": ("registry", "resolve_backend"),
    "select_moe_backend": ("registry", "build_backend"),
    "select_experts_kernel": ("registry", "experts_kernel"),
}
__all__ = [
    "Dispatched",
    "ExpertPlacement",
    "ExpertsKernel",
    "LocalMoE",
    "MoEBackend",
    "TorchAllToAllMoE",
    "group_by_expert",
    "resolve_moe_backend",
    "run_experts",
    "select_experts_kernel",
    "select_moe_backend",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
