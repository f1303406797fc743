"""Paged attention behind one interface: ``prepare(batch)`` once a forward, ``forward`` a layer.

Backends (``registry.py``): ``torch`` (reference, any device), ``triton`` (paged GQA decode
and extend, and absorbed MLA kernels: compiled on CUDA, interpreted on CPU under
``TRITON_INTERPRET=1``) and ``flashinfer`` (CUDA, optional extra). GPU packages are imported
only when their backend is built, so this package imports on a CPU-only machine.

This file imports nothing heavy: ``registry`` is read where torch must not load
(``ServerArgs`` lists the backends in every process, the ingress included), and Python runs
this file first. The package's names load on first use instead (PEP 562), from the module
that defines each.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roundgate.kernels.attention.base import AttentionBackend
    from roundgate.kernels.attention.batch import (
        AttentionBatch,
        PagedKVCache,
        build_attention_batch,
    )
    from roundgate.kernels.attention.mla_torch import TorchMLAAttention
    from roundgate.kernels.attention.registry import build as select_attention_backend
    from roundgate.kernels.attention.registry import build_latent as select_latent_attention_backend
    from roundgate.kernels.attention.registry import resolve as resolve_attention_backend
    from roundgate.kernels.attention.torch_ref import TorchAttention

# Each name -> (its module in this package, its name there).
_EXPORTS = {
    "AttentionBackend": ("base", "AttentionBackend"),
    "AttentionBatch": ("batch", "AttentionBatch"),
    "PagedKVCache": ("batch", "PagedKVCache"),
    "build_attention_batch": ("batch", "build_attention_batch"),
    "TorchAttention": ("torch_ref", "TorchAttention"),
    "TorchMLAAttention": ("mla_torch", "TorchMLAAttention"),
    "resolve_attention_backend": ("registry", "resolve"),
    "select_attention_backend": ("registry", "build"),
    "select_latent_attention_backend": ("registry", "build_latent"),
}
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


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
