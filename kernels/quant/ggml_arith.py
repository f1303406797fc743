"""llama.cpp's float arithmetic for the operations between the int8-dot products.

``--gguf-weights int8-dot`` promises llama.cpp's model: its integer products are ggml's bit
for bit (``block_gemm.cpp``), but with 8-bit activations that is not enough. A last-bit
difference in RMSNorm, RoPE, SwiGLU or attention can move an activation across a rounding
boundary of the next product's 8-bit codes, and from there two runs drift apart
(``benchmarks/int8_dot_sensitivity.py`` measured it: torch's operations put the greedy tokens
of 4 in 10 prompts off llama.cpp's within 32 tokens). So the int8-dot path also runs these
operations as ggml's CPU backend does (``ggml_arith.cpp``: double-summed RMSNorm, RoPE angles
as a running float product, ggml's own vectorised exp in SwiGLU and softmax, its dot-product
summation orders, K cached in the file's interleaved order), each checked against the
tensors llama.cpp itself computes for the default model.

Only the llama-style dense decoder is covered (RMSNorm, GQA with unscaled RoPE over the whole
head, SwiGLU): ``eligible`` says whether a model is; others keep torch's operations.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from roundgate.kernels.attention.batch import AttentionBatch, PagedKVCache
from roundgate.kernels.quant import build_library, cpu_supports_kernel

_SOURCE = Path(__file__).with_name("ggml_arith.cpp")
_CFLAGS = (
    "-O3",
    "-mavx2",
    "-mfma",
    "-mf16c",
    "-fopenmp",
    "-ffp-contract=off",
    "-shared",
    "-fPIC",
    "-std=c++17",
)
# Head sizes the attention has a kqv instance for (its dot products sum 32 at a time).
HEAD_SIZES = (32, 64, 96, 128, 256)
_lock = threading.Lock()
_lib: Any = None
_failure: str | None = None  # why the build failed: tried once per process


def library() -> Any:
    """The compiled operations (ctypes); raises RuntimeError, saying why, if this machine
    cannot build or run them (``unavailable`` asks without raising)."""
    global _lib, _failure
    if _lib is not None:  # every operation calls this: no lock once built
        return _lib
    with _lock:
        if _failure is not None:
            raise RuntimeError(_failure)
        if _lib is None:
            try:
                if not cpu_supports_kernel():
                    raise RuntimeError("llama.cpp's arithmetic needs AVX2/FMA/F16C")
                lib = ctypes.CDLL(str(build_library(_SOURCE, _CFLAGS)))
            except Exception as exc:
                _failure = str(exc)
                raise RuntimeError(_failure) from exc
            p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
            lib.ga_rms_norm.argtypes = [p, i64, i64, p, f32, p]
            lib.ga_rope_table.argtypes = [i64, i64, f32, p, p]
            lib.ga_rope.argtypes = [p, i64, i64, i64, i64, p, p]
            lib.ga_swiglu.argtypes = [p, i64, i64, p]
            lib.ga_attention.argtypes = [p, i64, p, p, i64, i64, i64, i64, i64, p, p]
            lib.ga_attention.argtypes += [p, p, p, i64, p, i64, i64, f32, p, i32, i32]
            for fn in (lib.ga_rms_norm, lib.ga_rope_table, lib.ga_rope, lib.ga_swiglu):
                fn.restype = None
            lib.ga_attention.restype = ctypes.c_int
            lib.ga_decoder.argtypes = [p, i64, i64, p, p, i64, i64, i64, i64, i64, f32, p, p]
            lib.ga_decoder.argtypes += [p, p, p, i64, p, i64, i64, i32, i32]
            lib.ga_decoder.restype = ctypes.c_int
            _lib = lib
        return _lib


def unavailable() -> str | None:
    """Why the operations cannot run here (no AVX2, no compiler: the caller warns and keeps
    torch's), or None once they are built."""
    try:
        library()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous() if x.dtype == torch.float32 else x.float().contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm(x) * weight`` over the last axis, as ggml rounds it."""
    x = _f32(x)
    n = x.shape[-1]
    y = torch.empty_like(x)
    library().ga_rms_norm(
        x.data_ptr(), x.numel() // n, n, _f32(weight).data_ptr(), eps, y.data_ptr()
    )
    return y


def rope_table(positions: int, dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's cos and sin ``[positions, dim / 2]`` for RoPE without scaling."""
    cos = torch.empty(positions, dim // 2)
    sin = torch.empty(positions, dim // 2)
    library().ga_rope_table(positions, dim, base, cos.data_ptr(), sin.data_ptr())
    return cos, sin


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, dim]`` (halves order; rows may be strided, heads contiguous) in
    place by ``cos``/``sin [T, dim / 2]``, with ggml's roundings."""
    tokens, heads, dim = x.shape
    if x.dtype != torch.float32 or x.stride(2) != 1 or x.stride(1) != dim:
        raise ValueError("rope_: x must be float32 [T, heads, dim] with contiguous heads")
    cos, sin = _f32(cos), _f32(sin)
    library().ga_rope(x.data_ptr(), tokens, heads, dim, x.stride(0), cos.data_ptr(), sin.data_ptr())
    return x


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for rows ``[gate | up]``, with ggml's exp."""
    gate_up = _f32(gate_up)
    n = gate_up.shape[-1] // 2
    y = gate_up.new_empty(*gate_up.shape[:-1], n)
    library().ga_swiglu(gate_up.data_ptr(), gate_up.numel() // (2 * n), n, y.data_ptr())
    return y


def _batch_args(batch: AttentionBatch) -> tuple[int, ...]:
    """The batch as ``ga_attention`` and ``ga_decoder`` read it: slots, positions, query
    offsets, sequences, the page table and its width (``build_attention_batch`` makes every
    one a contiguous int64 tensor, which the C side needs)."""
    tables = (batch.slot_mapping, batch.positions, batch.cu_query_lens, batch.page_table)
    if any(t.dtype != torch.int64 or not t.is_contiguous() for t in tables):
        raise ValueError("attention batch: the C operations need contiguous int64 tensors")
    page_table = batch.page_table
    return (
        batch.slot_mapping.data_ptr(),
        batch.positions.data_ptr(),
        batch.cu_query_lens.data_ptr(),
        batch.batch_size,
        page_table.data_ptr(),
        page_table.shape[1],
    )


def kq_scale(head_dim: int) -> float:
    """llama.cpp's attention scale, ``1.0f / sqrtf(head_dim)`` in float32 (the caller's
    ``head_dim ** -0.5`` in double may round to a neighbouring float)."""
    return float(1.0 / torch.tensor(float(head_dim)).sqrt())


class GgmlAttention:
    """Paged attention with llama.cpp's float32 arithmetic (an ``AttentionBackend``, CPU).

    K is cached in the file's interleaved order (the order ggml's q.k sums in), so a cache
    this backend wrote is read only by it: the runner uses it for every layer or none.
    """

    name = "ggml"

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads

    def prepare(self, batch: AttentionBatch) -> None:
        return None

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: PagedKVCache,
        batch: AttentionBatch,
        state: None,
        scale: float,
    ) -> torch.Tensor:
        """``q: [T, H, D]``, ``k, v: [T, H_kv, D]`` (rows may be strided) -> ``[T, H, D]``;
        ``scale`` is llama.cpp's for the head size (``kq_scale``), whatever is passed."""
        tokens, heads, dim = q.shape
        kv_heads = k.shape[1]
        if dim not in HEAD_SIZES:
            raise ValueError(f"GgmlAttention: head size {dim} is not one of {HEAD_SIZES}")
        if k.stride(0) != v.stride(0) or any(t.stride(2) != 1 for t in (q, k, v)):
            raise ValueError("GgmlAttention: q/k/v rows must have contiguous heads")
        out = q.new_empty(tokens, heads, dim)
        done = library().ga_attention(
            q.data_ptr(),
            q.stride(0),
            k.data_ptr(),
            v.data_ptr(),
            k.stride(0),
            tokens,
            heads,
            kv_heads,
            dim,
            cache.k[layer].data_ptr(),
            cache.v[layer].data_ptr(),
            *_batch_args(batch),
            cache.page_size,
            kq_scale(dim),
            out.data_ptr(),
            self.threads or torch.get_num_threads(),
            1,
        )
        if done != 0:
            raise RuntimeError(f"ga_attention failed ({done})")
        return out


class LayerWeights(ctypes.Structure):
    """``ggml_arith.cpp``'s ``LayerWeights``: one layer's pointers for ``decoder``."""

    _fields_ = [
        ("attn_norm", ctypes.c_void_p),
        ("qkv", ctypes.c_void_p),
        ("qkv_kind", ctypes.c_int64),
        ("o", ctypes.c_void_p),
        ("o_kind", ctypes.c_int64),
        ("ffn_norm", ctypes.c_void_p),
        ("gate_up", ctypes.c_void_p),
        ("gate_up_kind", ctypes.c_int64),
        ("down", ctypes.c_void_p),
        ("down_kind", ctypes.c_int64),
        ("k_cache", ctypes.c_void_p),
        ("v_cache", ctypes.c_void_p),
    ]


@dataclass(frozen=True)
class DecoderShape:
    """The sizes ``decoder`` needs besides the weights."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float


def decoder(
    h: torch.Tensor,
    layers: ctypes.Array,
    product: int,
    shape: DecoderShape,
    cos: torch.Tensor,
    sin: torch.Tensor,
    batch: AttentionBatch,
    page_size: int,
    file_order: bool,
) -> torch.Tensor:
    """Every layer of a llama-style decoder on ``h [T, hidden]`` (in place) in one call, with
    llama.cpp's arithmetic; ``product``: the address of the block product (int8-dot or exact);
    ``file_order``: K cached in the file's order (``GgmlAttention``'s) rather than halves
    (``TorchAttention``'s)."""
    if h.dtype != torch.float32 or not h.is_contiguous():
        raise ValueError("decoder: h must be contiguous float32")
    cos, sin = _f32(cos), _f32(sin)
    done = library().ga_decoder(
        h.data_ptr(),
        h.shape[0],
        len(layers),
        ctypes.addressof(layers),
        product,
        shape.hidden,
        shape.heads,
        shape.kv_heads,
        shape.head_dim,
        shape.intermediate,
        shape.eps,
        cos.data_ptr(),
        sin.data_ptr(),
        *_batch_args(batch),
        page_size,
        torch.get_num_threads(),
        int(file_order),
    )
    if done != 0:
        raise RuntimeError(f"ga_decoder failed ({done})")
    return h
