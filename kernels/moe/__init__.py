"""MoE expert dispatch/combine across the DP group (``--moe-backend``: ``local``, ``torch``,
``deepep``), and the expert computation between them (``--moe-kernel``: ``torch``, a GEMM pair
per expert, or ``triton``, fused grouped GEMMs).

Attention is data-parallel (each rank its own batch); experts are sharded over the same
ranks (``ExpertPlacement``), so every MoE layer is a group collective.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from roundgate.kernels.moe.base import Dispatched, MoEBackend, group_by_expert, run_experts
from roundgate.kernels.moe.local import LocalMoE
from roundgate.kernels.moe.placement import ExpertPlacement
from roundgate.kernels.moe.torch_a2a import TorchAllToAllMoE
from roundgate.kernels.triton_env import check_triton_device

# ``run_experts``' signature: grouped rows, rows per local expert, w13, w2 -> unweighted rows.
ExpertsKernel = Callable[[torch.Tensor, list[int], torch.Tensor, torch.Tensor], torch.Tensor]
MOE_KERNELS = ("torch", "triton")

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


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def resolve_moe_backend(
    name: str,
    world_size: int,
    device: torch.device | str,
    available: Callable[[str], bool] = _importable,
) -> str:
    """The backend ``--moe-backend name`` means for a group of ``world_size`` on ``device``.

    ``auto``: ``local`` for one rank; ``deepep`` on CUDA when ``deep_ep`` is importable;
    else ``torch``. ``torch`` on one rank is ``local`` (nothing to send). Impossible explicit
    choices are a ``ValueError`` naming the flag.
    """
    kind = torch.device(device).type
    if name == "auto":
        if world_size == 1:
            return "local"
        return "deepep" if kind == "cuda" and available("deep_ep") else "torch"
    if name == "local":
        if world_size != 1:
            raise ValueError(f"--moe-backend local needs --dp-size 1, got {world_size}")
        return name
    if name == "torch":
        # One rank has nobody to talk to: the local path is the same computation.
        return "torch" if world_size > 1 else "local"
    if name == "deepep":
        if kind != "cuda":
            raise ValueError(f"--moe-backend deepep needs a CUDA device, got {kind}")
        if not available("deep_ep"):
            raise ValueError("--moe-backend deepep: the 'deep_ep' package is not installed")
        return name
    raise ValueError(f"--moe-backend must be one of auto, local, torch, deepep, got {name!r}")


def select_moe_backend(
    name: str,
    placement: ExpertPlacement,
    *,
    group: Any = None,
    device: torch.device | str = "cpu",
    hidden_size: int = 0,
    max_dispatch_tokens_per_rank: int = 0,
) -> MoEBackend:
    """Build the resolved backend (``hidden_size`` and the token cap: DeepEP only)."""
    chosen = resolve_moe_backend(name, placement.world_size, device)
    if chosen == "local":
        return LocalMoE(placement)
    if chosen == "deepep":
        from roundgate.kernels.moe.deepep import DeepEPMoE

        return DeepEPMoE(placement, group, hidden_size, max_dispatch_tokens_per_rank)
    return TorchAllToAllMoE(placement, group)


def select_experts_kernel(
    name: str, device: torch.device | str, available: Callable[[str], bool] = _importable
) -> ExpertsKernel:
    """The expert computation ``--moe-kernel name`` means on ``device``.

    ``torch``: ``run_experts``. ``triton``: the fused kernels of ``triton_experts`` (CUDA, or
    CPU under ``TRITON_INTERPRET=1``); impossible choices are a ``ValueError`` naming the flag.
    """
    if name == "torch":
        return run_experts
    if name != "triton":
        raise ValueError(f"--moe-kernel must be one of {', '.join(MOE_KERNELS)}, got {name!r}")
    check_triton_device("--moe-kernel", torch.device(device).type)
    if not available("triton"):
        raise ValueError("--moe-kernel triton: the 'triton' package is not installed")
    from roundgate.kernels.moe.triton_experts import triton_run_experts

    return triton_run_experts
