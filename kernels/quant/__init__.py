"""Linear layers over GGUF block-quantized weights, kept as the file's own blocks.

A CPU decode step is bound by reading the weights (see ``benchmarks/bench_cpu_gemm.py``).
GGUF's Q4_0, Q4_1 and Q8_0 store each run of 32 weights as small integers with an f16 scale
(and, for Q4_1, an f16 offset). ``BlockWeights`` holds those blocks byte for byte as in the
file (4.5 to 8.5 bits a weight), and ``block_linear`` multiplies by them directly with an AVX2
kernel (built on first use with g++), the nibbles widened only in registers. Two products:

- exact (the default): the float32 products of the dequantized weights, summation order
  aside (each block is decoded to exactly the float32 weights the gguf package gives);
- int8-dot (``int8_dot=True``): activations quantized per 32-block to 8 bits and integer dot
  products, llama.cpp's arithmetic (faster, and no longer equal to the float32 model).

Exact prefill-sized inputs (many rows) are compute-bound instead: there the weight is
dequantized for the call and the float32 GEMM runs, which is faster than the vector kernel.

K-quants (Q4_K, Q5_K, Q6_K) are not packed: their layers keep the float32 weights the gguf
package dequantizes (correct, but four bytes a weight); see ``FORMATS`` for what is.
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
# Rows of input above which the exact product dequantizes and runs the float32 GEMM.
GEMM_ROWS = 48
_SOURCE = Path(__file__).with_name("block_gemm.cpp")
_CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
_lock = threading.Lock()
_module: Any = None
_failure: str | None = None


@dataclass(frozen=True)
class BlockFormat:
    """One GGUF block type the kernel reads: its code in block_gemm.cpp and its layout."""

    name: str
    code: int
    block_bytes: int  # bytes of one block of 32 weights (f16 scale, [f16 offset], quants)
    has_offset: bool


FORMATS = {
    "Q4_0": BlockFormat("Q4_0", 0, 18, False),
    "Q4_1": BlockFormat("Q4_1", 1, 20, True),
    "Q8_0": BlockFormat("Q8_0", 2, 34, False),
}


@dataclass(frozen=True)
class BlockWeights:
    """A weight ``[N, K]`` as ``N`` rows of ``K / 32`` GGUF blocks of ``format``."""

    data: torch.Tensor  # [N, K / 32 * block_bytes] uint8, the file's bytes
    format: BlockFormat
    in_features: int

    def __post_init__(self) -> None:
        k, fmt = self.in_features, self.format
        if k % BLOCK or self.data.dtype != torch.uint8 or self.data.dim() != 2:
            raise ValueError(
                f"block weights: {k} columns, data {self.data.dtype} {self.data.dim()}-D"
            )
        if self.data.shape[1] != k // BLOCK * fmt.block_bytes:
            raise ValueError(
                f"block weights: {fmt.name} rows of {k} weights take "
                f"{k // BLOCK * fmt.block_bytes} bytes, not {self.data.shape[1]}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return (self.data.shape[0], self.in_features)

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """The float32 weights, computed as the gguf package does (the kernel's reference)."""
        n, k = self.shape
        blocks = self.data.view(n, k // BLOCK, self.format.block_bytes)
        d = _f16(blocks[..., 0:2])
        if self.format.name == "Q8_0":
            q = blocks[..., 2:].view(torch.int8).float()
            return (d * q).view(n, k)
        qs = blocks[..., 4:] if self.format.has_offset else blocks[..., 2:]
        q = torch.cat([qs & 0x0F, qs >> 4], dim=-1)
        if not self.format.has_offset:
            return (d * (q.to(torch.int8) - 8).float()).view(n, k)
        return (d * q.float() + _f16(blocks[..., 2:4])).view(n, k)

    @staticmethod
    def cat(parts: list[BlockWeights]) -> BlockWeights | None:
        """Row-wise concatenation (a fused projection built from several checkpoint tensors);
        None when the parts' formats or widths differ."""
        first = parts[0]
        if any(p.format != first.format or p.in_features != first.in_features for p in parts):
            return None
        return BlockWeights(torch.cat([p.data for p in parts]), first.format, first.in_features)


def _f16(pairs: torch.Tensor) -> torch.Tensor:
    """Little-endian f16 from byte pairs ``[..., 2]`` as float32 ``[..., 1]``."""
    return pairs.contiguous().view(torch.float16).float()


def cpu_supports_kernel() -> bool:
    """AVX2 with FMA and F16C (what the kernel is compiled for); x86-64 Linux only."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(f" {flag}" in flags for flag in ("avx2", "fma", "f16c"))


def kernel() -> Any:
    """The compiled kernel library (ctypes), built once per machine and source under the
    cache folder; None if it cannot be built here (the caller keeps float32 weights)."""
    global _module, _failure
    if _module is not None:  # every product calls this: no lock once built
        return _module
    with _lock:
        if _module is not None or _failure is not None:
            return _module
        if not cpu_supports_kernel():
            _failure = "this CPU lacks AVX2/FMA/F16C"
            logger.warning("block-quantized kernel unavailable (%s)", _failure)
            return None
        try:
            _module = _load(_build())
        except Exception as exc:  # no compiler: float32 weights still work
            _failure = f"{type(exc).__name__}: {exc}"
            logger.warning("block-quantized kernel unavailable (%s)", _failure)
        return _module


def _build() -> Path:
    return build_library(_SOURCE, _CFLAGS)


def build_library(source_path: Path, cflags: tuple[str, ...]) -> Path:
    """Compile ``source_path`` unless its library is cached (keyed by the source's and the
    flags' hash) under the cache folder; raises with the compiler's message if it fails."""
    source = source_path.read_bytes()
    digest = hashlib.sha256(source + " ".join(cflags).encode()).hexdigest()[:16]
    root = Path(os.environ.get("ROUNDGATE_CACHE", Path.home() / ".cache" / "roundgate"))
    library = root / "kernels" / f"{source_path.stem}-{digest}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # Ranks may build at once: each writes its own file and renames it into place.
    partial = library.with_suffix(f".{os.getpid()}.tmp")
    compiler = os.environ.get("CXX", "g++")
    done = subprocess.run(
        [compiler, *cflags, "-o", str(partial), str(source_path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
    os.replace(partial, library)
    return library


def _load(library: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library))
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for name in ("block_linear_f32", "block_linear_q8"):
        fn = getattr(lib, name)
        fn.argtypes = [p, i64, i64, p, i32, i64, p, i32]
        fn.restype = None
    lib.block_dequantize.argtypes = [p, i32, i64, i64, p, i32]
    lib.block_dequantize.restype = None
    return lib


def kernel_failure() -> str | None:
    """Why ``kernel()`` returned None (after it was called), else None."""
    return _failure


def dequantize_fast(weights: BlockWeights) -> torch.Tensor:
    """``weights.dequantize()`` by the kernel (threaded; the same float32 values)."""
    n, k = weights.shape
    out = torch.empty(n, k, dtype=torch.float32)
    kernel().block_dequantize(
        weights.data.data_ptr(), weights.format.code, n, k, out.data_ptr(), torch.get_num_threads()
    )
    return out


def block_linear(x: torch.Tensor, weights: BlockWeights, int8_dot: bool = False) -> torch.Tensor:
    """``x @ dequantize(weights).T`` for 2-D float32 ``x`` on the CPU (rows: tokens); with
    ``int8_dot``, llama.cpp's approximation of it (``x`` quantized per 32-block to 8 bits)."""
    rows, k = x.shape
    n = weights.shape[0]
    if k != weights.in_features:
        raise ValueError(f"block_linear: x has {k} columns, the weight {weights.in_features}")
    if rows > GEMM_ROWS and not int8_dot:
        return F.linear(x, dequantize_fast(weights))
    x = x.contiguous()
    y = torch.empty(rows, n, dtype=torch.float32)
    lib = kernel()
    fn = lib.block_linear_q8 if int8_dot else lib.block_linear_f32
    fn(
        x.data_ptr(),
        rows,
        k,
        weights.data.data_ptr(),
        weights.format.code,
        n,
        y.data_ptr(),
        torch.get_num_threads(),
    )
    return y


class BlockLinear(nn.Module):
    """Stands in for an ``nn.Linear`` whose weight is block-quantized (no bias)."""

    def __init__(self, weights: BlockWeights, int8_dot: bool = False) -> None:
        super().__init__()
        self.weights = weights
        self.int8_dot = int8_dot
        self.out_features, self.in_features = weights.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out = block_linear(x.reshape(-1, self.in_features).float(), self.weights, self.int8_dot)
        return out.view(*lead, self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        product = "int8-dot" if self.int8_dot else "exact"
        kind = self.weights.format.name
        return f"in={self.in_features}, out={self.out_features}, {kind} ({product})"
