"""KV pool sizing from a memory budget: pure arithmetic on the architecture's bytes per token.

``--kv-cache-memory-gb G`` gives each rank ``floor(G GiB / (bytes_per_token * page_size))``
pages, computed once in ``ServerArgs`` so the scheduler's ``KVPool`` and the runner's cache
agree. ``--gpu-memory-utilization`` needs the free memory after the weights load, so the
runner computes it (``gpu_pages``) on CUDA only.
"""

from __future__ import annotations

from typing import Any

KV_ELEMENT_SIZE = {"cpu": 4, "cuda": 2}  # float32 on CPU, bf16 on CUDA (see ModelRunner)


def pages_for_budget(budget_bytes: float, bytes_per_token: int, page_size: int) -> int:
    """Whole pages of ``page_size`` tokens that fit ``budget_bytes``; too small is an error.

    >>> pages_for_budget(2**30, 2 * 32 * 128 * 32 * 2, 16)  # Llama-2-7B's KV in bf16
    128
    """
    pages = int(budget_bytes // (bytes_per_token * page_size))
    if pages < 1:
        raise ValueError(
            f"KV budget {budget_bytes / 2**30:.4g} GiB holds no page of {page_size} tokens at "
            f"{bytes_per_token} B/token"
        )
    return pages


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def pages_from_flags(args: Any) -> int | None:
    """The page count ``--kv-cache-memory-gb`` implies (``None``: keep ``--num-kv-pages``);
    refuses bad budget flags naming them."""
    budget, share = args.kv_cache_memory_gb, args.gpu_memory_utilization
    if budget is not None and share is not None:
        raise ValueError("--kv-cache-memory-gb and --gpu-memory-utilization exclude each other")
    if share is not None:
        if not _number(share) or not 0 < share <= 1:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {share!r}")
        if args.device == "cpu":
            raise ValueError("--gpu-memory-utilization applies to --device cuda only")
    if budget is None:
        return None
    if not _number(budget) or not budget > 0:
        raise ValueError(f"--kv-cache-memory-gb must be a number > 0, got {budget!r}")
    if args.device not in KV_ELEMENT_SIZE:
        raise ValueError(
            "--kv-cache-memory-gb needs --device cpu or cuda (the KV dtype follows it)"
        )
    per_token = args.model_config.kv_bytes_per_token(KV_ELEMENT_SIZE[args.device])
    return pages_for_budget(budget * 2**30, per_token, args.page_size)


def gpu_pages(
    total_bytes: int, free_bytes: int, share: float, bytes_per_token: int, page_size: int
) -> int:
    """Pages for ``--gpu-memory-utilization share``: the share of the device's memory minus
    what is already in use (the weights, just loaded).

    >>> gpu_pages(100 * 2**30, 60 * 2**30, 0.9, 2**20, 16)  # 90 GiB - 40 GiB used = 50 GiB
    3200
    """
    budget = share * total_bytes - (total_bytes - free_bytes)
    if budget <= 0:
        raise ValueError(
            f"--gpu-memory-utilization {share}: the weights already use "
            f"{(total_bytes - free_bytes) / 2**30:.1f} GiB of {total_bytes / 2**30:.1f} GiB"
        )
    return pages_for_budget(budget, bytes_per_token, page_size)
