"""The interface every paged-attention backend implements (``registry.py`` lists them)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from roundgate.kernels.attention.batch import AttentionBatch, PagedKVCache


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
