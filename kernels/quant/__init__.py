"""Linear layers over GGUF block-quantized weights, without dequantizing them to float32.

A CPU decode step is bound by reading the weights (see ``benchmarks/bench_cpu_gemm.py``).
GGUF's Q4_1 and Q8_0 store each run of 32 weights as small integers with a scale (and, for
Q4_1, an offset); kept in that form (one byte a weight plus two floats a block) a decode step
reads about a third of the bytes of float32 weights. ``block_linear`` multiplies by them
directly (an AVX2 kernel, built on first use with PyTorch's C++ extension loader) and gives
the float32 products of the dequantized weights, up to summation order.

Prefill-sized inputs (many rows) are compute-bound instead: there the weight is dequantized
for the call and the float32 GEMM runs, which is faster than the vector kernel at that size.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger("roundgate.kernels")

BLOCK = 32
# Rows of input above which the dequantize-then-GEMM path wins (prefill chunks).
GEMM_ROWS = 48
# From this many rows the kernel multiplies by a dequantized panel and ignores the block sums
# (the same number as ``PANEL_ROWS`` in block_gemm.cpp).
PANEL_ROWS = 6
_SOURCE = Path(__file__).with_name("block_gemm.cpp")
_CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
_lock = threading.Lock()
_module: Any = None
_failure: str | None = None


@dataclass(frozen=True)
class BlockWeights:
    """``w[n, 32j + i] = scale[n, j] * q[n, 32j + i] + offset[n, j]`` (no offset: 0)."""

    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N, K / 32] float32
    offset: torch.Tensor | None  # [N, K / 32] float32, or None

    def __post_init__(self) -> None:
        n, k = self.q.shape
        if k % BLOCK or self.scale.shape != (n, k // BLOCK):
            raise ValueError(f"block weights: q {tuple(self.q.shape)}, scale {self.scale.shape}")
        if self.offset is not None and self.offset.shape != self.scale.shape:
            raise ValueError("block weights: offset and scale shapes differ")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]

    @property
    def nbytes(self) -> int:
        extra = 0 if self.offset is None else self.offset.numel() * 4
        return self.q.numel() + self.scale.numel() * 4 + extra

    def dequantize(self) -> torch.Tensor:
        n, k = self.q.shape
        w = self.q.view(n, k // BLOCK, BLOCK).float() * self.scale[..., None]
        if self.offset is not None:
            w = w + self.offset[..., None]
        return w.view(n, k)

    @staticmethod
    def cat(parts: list[BlockWeights]) -> BlockWeights:
        """Row-wise concatenation (a fused projection built from several checkpoint tensors)."""
        offsets = [p.offset for p in parts]
        if any(o is None for o in offsets) and not all(o is None for o in offsets):
            offsets = [torch.zeros_like(p.scale) if p.offset is None else p.offset for p in parts]
        return BlockWeights(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            None if offsets[0] is None else torch.cat(offsets),  # type: ignore[arg-type]
        )


def cpu_supports_kernel() -> bool:
    """AVX2 with FMA (what the kernel is compiled for); x86-64 Linux only."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags


def kernel() -> Any:
    """The compiled kernel (a ctypes function), built once per machine and source under the
    cache folder; None if it cannot be built here (the caller keeps float32 weights)."""
    global _module, _failure
    with _lock:
        if _module is not None or _failure is not None:
            return _module
        if not cpu_supports_kernel():
            _failure = "this CPU lacks AVX2/FMA"
            return None
        try:
            _module = _load(_build())
        except Exception as exc:  # no compiler: float32 weights still work
            _failure = f"{type(exc).__name__}: {exc}"
            logger.warning("block-quantized kernel unavailable (%s)", _failure)
        return _module


def _build() -> Path:
    """Compile the kernel unless this source's library is cached (keyed by its hash)."""
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(_CFLAGS).encode()).hexdigest()[:16]
    root = Path(os.environ.get("ROUNDGATE_CACHE", Path.home() / ".cache" / "roundgate"))
    library = root / "kernels" / f"block_gemm-{digest}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # Ranks may build at once: each writes its own file and renames it into place.
    partial = library.with_suffix(f".{os.getpid()}.tmp")
    compiler = os.environ.get("CXX", "g++")
    done = subprocess.run(
        [compiler, *_CFLAGS, "-o", str(partial), str(_SOURCE)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
    os.replace(partial, library)
    return library


def _load(library: Path) -> Any:
    lib = ctypes.CDLL(str(library))
    fn = lib.block_linear_f32
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, i64, i64, p, p, p, p, i64, p, ctypes.c_int]
    fn.restype = None
    return fn


def kernel_failure() -> str | None:
    """Why ``kernel()`` returned None (after it was called), else None."""
    return _failure


def block_linear(x: torch.Tensor, weights: BlockWeights) -> torch.Tensor:
    """``x @ dequantize(weights).T`` for 2-D float32 ``x`` on the CPU (rows: tokens)."""
    rows, k = x.shape
    if rows > GEMM_ROWS:
        return F.linear(x, weights.dequantize())
    n = weights.q.shape[0]
    if k != weights.q.shape[1]:
        raise ValueError(f"block_linear: x has {k} columns, the weight {weights.q.shape[1]}")
    x = x.contiguous()
    offset = weights.offset
    # The offsets' share, sum_j offset[n, j] * sum(x block j), is taken per x row at once.
    xsum = None
    if offset is not None and rows < PANEL_ROWS:
        xsum = x.view(rows, k // BLOCK, BLOCK).sum(-1)
    y = torch.empty(rows, n, dtype=torch.float32)
    kernel()(
        x.data_ptr(),
        rows,
        k,
        weights.q.data_ptr(),
        weights.scale.data_ptr(),
        None if offset is None else offset.data_ptr(),
        None if xsum is None else xsum.data_ptr(),
        n,
        y.data_ptr(),
        torch.get_num_threads(),
    )
    return y


class BlockLinear(nn.Module):
    """Stands in for an ``nn.Linear`` whose weight is block-quantized (no bias)."""

    def __init__(self, weights: BlockWeights) -> None:
        super().__init__()
        self.weights = weights
        self.out_features, self.in_features = weights.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out = block_linear(x.reshape(-1, self.in_features).float(), self.weights)
        return out.view(*lead, self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        kind = "q+offset" if self.weights.offset is not None else "q"
        return f"in={self.in_features}, out={self.out_features}, blocks of {BLOCK} ({kind})"
