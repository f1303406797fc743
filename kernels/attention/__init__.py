"""Paged attention behind one interface: ``prepare(batch)`` once a forward, ``forward`` a layer.

Backends: ``torch`` (reference, any device), ``triton`` (paged GQA decode and extend, and
absorbed MLA kernels: compiled on CUDA, interpreted on CPU under ``TRITON_INTERPRET=1``) and
``flashinfer`` (CUDA, optional extra). GPU packages are imported only when their backend
is built, so this package imports on a CPU-only machine.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any, Protocol

import torch

from roundgate.kernels.attention.batch import AttentionBatch, PagedKVCache, build_attention_batch
from roundgate.kernels.attention.mla_torch import TorchMLAAttention
from roundgate.kernels.attention.torch_ref import TorchAttention
from roundgate.kernels.triton_env import check_triton_device

__all__ = [
    "AttentionBackend",
    "AttentionBatch",
    "PagedKVCache",
    "TorchAttention",
    "TorchMLAAttention",
    "build_attention_batch",
    "resolve_attention_backend",
    "select_attention_backend",
    "select_latent_attention_backend",
]

GPU_BACKENDS = ("flashinfer", "triton")  # "auto" preference order on CUDA


class AttentionBackend(Protocol):
    """One paged-attention implementation."""

    name: str

    def prepare(self, batch: AttentionBatch) -> Any:
        """Per-forward state shared by every layer (masks, gather indices, a kernel plan)."""
        ...

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: PagedKVCache,
        batch: AttentionBatch,
        state: Any,
        scale: float,
    ) -> torch.Tensor:
        """Write the new tokens' k/v to ``cache`` and attend: ``[T, H, D]`` out."""
        ...


def is_importable(module: str) -> bool:
    """Whether ``module`` could be imported, without importing it."""
    return importlib.util.find_spec(module) is not None


def resolve_attention_backend(
    name: str, device: torch.device | str, available: Callable[[str], bool] = is_importable
) -> str:
    """The backend ``--attention-backend name`` means on ``device``.

    ``auto`` is ``torch`` on CPU and the first importable of flashinfer, triton on CUDA
    (``torch`` if neither is). An explicit GPU backend on CPU, or without its package, is a
    ``ValueError`` naming the flag rather than a silent fallback; the one exception is
    ``triton`` on CPU under Triton's interpreter (``TRITON_INTERPRET=1``, for tests).
    """
    kind = torch.device(device).type
    if name == "auto":
        if kind == "cuda":
            return next((b for b in GPU_BACKENDS if available(b)), "torch")
        return "torch"
    if name == "torch":
        return name
    if name == "triton":
        check_triton_device("--attention-backend", kind)
    if name in GPU_BACKENDS:
        if kind != "cuda" and name != "triton":
            raise ValueError(f"--attention-backend {name} needs a CUDA device, got {kind}")
        if not available(name):
            raise ValueError(f"--attention-backend {name}: the {name!r} package is not installed")
        return name
    raise ValueError(
        f"--attention-backend must be one of auto, torch, {', '.join(GPU_BACKENDS)}, got {name!r}"
    )


def select_attention_backend(
    name: str,
    device: torch.device | str,
    *,
    num_heads: int = 0,
    num_kv_heads: int = 0,
    head_dim: int = 0,
    dtype: torch.dtype = torch.float32,
) -> AttentionBackend:
    """Build the backend ``resolve_attention_backend`` picks (shape args: FlashInfer only)."""
    chosen = resolve_attention_backend(name, device)
    if chosen == "flashinfer":
        from roundgate.kernels.attention.flashinfer_backend import FlashInferAttention

        return FlashInferAttention(num_heads, num_kv_heads, head_dim, dtype, device)
    if chosen == "triton":
        from roundgate.kernels.attention.triton_backend import TritonAttention

        return TritonAttention()
    return TorchAttention()


def select_latent_attention_backend(name: str, device: torch.device | str) -> Any:
    """The latent-attention (MLA) backend: ``triton`` (the absorbed kernel) or the torch
    reference.

    ``auto`` means torch here: the Triton MLA kernel has not yet run on a GPU, so it is
    taken only when asked for. FlashInfer is refused naming the flag (its MLA kernel is not
    wired in).
    """
    chosen = resolve_attention_backend(name, device)
    if name == "triton":
        from roundgate.kernels.attention.triton_backend import TritonMLAAttention

        return TritonMLAAttention()
    if name != "auto" and chosen != "torch":
        raise ValueError(
            f"--attention-backend {name} has no latent-attention (MLA) kernel here; "
            "use torch or triton"
        )
    return TorchMLAAttention()
