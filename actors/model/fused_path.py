"""Which parts of a rank's forward run on the fused decode path, decided once at startup.

A DeepSeek-V3 decode round is host-bound when each layer dispatches a hundred small torch
ops: 61 layers make thousands of launches against a ~17 ms device floor. The fused path
(``kernels/fused``, ``kernels/attention/triton_mla_prep``, ``kernels/moe/triton_router``,
``kernels/moe/triton_fused_moe``) does each norm, the MLA preamble, the router and the
activation in one Triton launch, and, on a rank that holds every expert, runs the experts
without reading expert counts back to the host. ``benchmarks/op_budget.py`` counts it.

It rides the Triton attention backend, which ``auto`` picks on CUDA: where attention runs
on Triton, so can the rest. The torch and ggml backends keep the reference arithmetic
(transformers' op order, llama.cpp's), which the equality tests pin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roundgate.kernels.moe.base import MoEBackend
from roundgate.kernels.moe.local import LocalMoE


@dataclass(frozen=True)
class FusedKernels:
    """The fused path's kernels, imported once (their modules import triton, which the
    reference path never does); the layers call them through ``ForwardContext.fused``."""

    rms_norm: Callable[..., Any]
    add_rms_norm: Callable[..., Any]
    silu_mul: Callable[..., Any]
    mla_prep: Callable[..., Any]
    route: Callable[..., Any]
    fused_moe: Callable[..., Any]

    @staticmethod
    def load() -> FusedKernels:
        from roundgate.kernels.attention.triton_mla_prep import mla_prep
        from roundgate.kernels.fused.triton_act import silu_mul
        from roundgate.kernels.fused.triton_norm import add_rms_norm, rms_norm
        from roundgate.kernels.moe.triton_fused_moe import fused_moe
        from roundgate.kernels.moe.triton_router import route

        return FusedKernels(rms_norm, add_rms_norm, silu_mul, mla_prep, route, fused_moe)


@dataclass(frozen=True)
class FusedPath:
    """``layers``: norms, activation, MLA preamble and router fused. ``moe``: the experts on
    the device-only fused kernel too (every MoE layer ``runs_fused``, checked here once).
    ``kernels``: what the layers call (loaded when ``layers``)."""

    layers: bool = False
    moe: bool = False
    kernels: FusedKernels | None = field(default=None, compare=False, repr=False)

    def moe_graph_safe(self, backend: MoEBackend | None) -> bool:
        """Whether the MoE layers can run inside a captured decode graph: the backend's legs
        read nothing back, or the fused experts replace them."""
        return backend is not None and (backend.is_graph_safe or self.moe)


def choose_fused_path(
    attention: str, experts_kernel: Any, moe: MoEBackend | None, counts_load: bool, model: Any
) -> FusedPath:
    """The fused path for a rank whose attention backend resolved to ``attention``.

    The experts go fused only when the rank holds all of them (the ``local`` backend: no
    dispatch to replace), ``--moe-kernel`` chose Triton, EPLB does not count their load
    (``counts_load``), and every MoE layer of ``model`` ``runs_fused``.
    """
    if attention != "triton":
        return FusedPath()
    fused_moe = (
        isinstance(moe, LocalMoE)
        and getattr(experts_kernel, "__name__", "") == "triton_run_experts"
        and not counts_load
        and all(layer.runs_fused for layer in model.moe_layers())
    )
    return FusedPath(layers=True, moe=fused_moe, kernels=FusedKernels.load())


def masked_experts_fit(experts_kernel: Any, model: Any, device: Any) -> bool:
    """Whether the experts can run on a masked layout (``MoEBackend.take_masked_experts``):
    ``--moe-kernel`` chose Triton, or every MoE layer holds FP8 experts on CUDA (their
    Triton FP8 kernel takes the masked layout whatever ``--moe-kernel`` says)."""
    if getattr(experts_kernel, "__name__", "") == "triton_run_experts":
        return True
    layers = model.moe_layers()
    on_cuda = getattr(device, "type", device) == "cuda"
    return on_cuda and bool(layers) and all(layer.fp8_rows is not None for layer in layers)
