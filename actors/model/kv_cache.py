"""The rank's KV cache and its attention backend, chosen from the architecture.

GQA models cache K and V per KV head; MLA models cache only their latent (see
``kernels/attention/batch.py``). ``ModelConfig.kv_bytes_per_token`` is the one formula for
both, used by ``--kv-cache-memory-gb`` sizing (``ServerArgs``) and checked against the
allocated tensors here.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from roundgate.actors.kv_budget import gpu_pages
from roundgate.actors.model.config import ModelConfig
from roundgate.kernels.attention.batch import PagedKVCache
from roundgate.kernels.attention.registry import build as select_attention_backend
from roundgate.kernels.attention.registry import build_latent as select_latent_attention_backend

logger = logging.getLogger(__name__)


def select_backend(name: str, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> Any:
    """The paged-attention backend ``name`` (``--attention-backend``) for this architecture
    (latent for MLA)."""
    if config.mla is not None:
        return select_latent_attention_backend(name, device)
    return select_attention_backend(
        name,
        device,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        dtype=dtype,
    )


def allocate_cache(
    num_kv_pages: int,
    page_size: int,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
) -> PagedKVCache:
    """``num_kv_pages`` pages of ``page_size`` tokens in the architecture's layout, plus one
    scratch page (the last: padded rows of graph-captured decode rounds write there; the KV
    pool never hands it out); logs what it holds."""
    num_pages = num_kv_pages + 1
    if config.mla is not None:
        cache = PagedKVCache.allocate_latent(
            config.num_cache_layers,
            num_pages,
            page_size,
            config.mla.latent_width,
            dtype,
            device,
        )
    else:
        cache = PagedKVCache.allocate(
            config.num_cache_layers,
            num_pages,
            page_size,
            config.num_kv_heads,
            config.head_dim,
            dtype,
            device,
        )
    per_token = config.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())
    if cache.bytes_per_token != per_token:  # the formula ServerArgs sizes the pool with
        raise RuntimeError(f"KV cache holds {cache.bytes_per_token} B/token, expected {per_token}")
    tokens = num_kv_pages * page_size
    logger.info(
        "KV cache: %d pages x %d tokens = %d max concurrent tokens, %d B/token, %.3f GiB",
        num_kv_pages,
        page_size,
        tokens,
        per_token,
        tokens * per_token / 2**30,
    )
    return cache


def pages_for_gpu(share: float, page_size: int, config: ModelConfig, device: torch.device) -> int:
    """The page count ``--gpu-memory-utilization share`` leaves after the weights."""
    if device.type != "cuda":
        raise ValueError("--gpu-memory-utilization applies to --device cuda only")
    free, total = torch.cuda.mem_get_info(device)
    return gpu_pages(total, free, share, config.kv_bytes_per_token(2), page_size)
