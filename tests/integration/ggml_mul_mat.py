"""ggml's own ``mul_mat`` on raw GGUF blocks, called through ctypes in the library that the
``xllamacpp`` package ships (``make llamacpp``): llama.cpp's CPU backend, statically linked, its C
API exported.

    python tests/integration/ggml_mul_mat.py LIBRARY INPUTS.npz OUTPUTS.npz

``INPUTS.npz`` holds, per case ``c``: ``raw_c`` (``[N, row bytes]`` uint8 blocks), ``kind_c``
(``Q4_0``, ``Q4_1`` or ``Q8_0``), ``x_c`` (``[B, K]`` float32); ``OUTPUTS.npz`` gets ``y_c``
(``[B, N]``), computed by one ggml graph per case on one thread. It imports numpy only and runs
in its own process, so llama.cpp's library never shares one with torch's.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

# ggml's enum ggml_type: the block types the int8-dot kernel reads, and float32.
GGML_TYPES = {"F32": 0, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
# Room for one case's tensors and the graph's work buffer (x quantized to Q8_0/Q8_1).
_OVERHEAD = 16 << 20


class InitParams(ctypes.Structure):
    """ggml's ``struct ggml_init_params``, passed by value to ``ggml_init``."""

    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


def load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    signatures = {
        "ggml_init": ([InitParams], p),
        "ggml_new_tensor_2d": ([p, ctypes.c_int, i64, i64], p),
        "ggml_mul_mat": ([p, p, p], p),
        "ggml_new_graph": ([p], p),
        "ggml_build_forward_expand": ([p, p], None),
        "ggml_graph_compute_with_ctx": ([p, p, ctypes.c_int], ctypes.c_int),
        "ggml_get_data": ([p], p),
        "ggml_nbytes": ([p], ctypes.c_size_t),
        "ggml_free": ([p], None),
        "ggml_cpu_init": ([], None),
    }
    for name, (args, result) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    lib.ggml_cpu_init()
    return lib


def _fill(lib: ctypes.CDLL, tensor: int, array: np.ndarray) -> None:
    data = np.ascontiguousarray(array)
    if data.nbytes != lib.ggml_nbytes(tensor):
        raise ValueError(f"{data.nbytes} bytes for a tensor of {lib.ggml_nbytes(tensor)}")
    ctypes.memmove(lib.ggml_get_data(tensor), data.ctypes.data, data.nbytes)


def mul_mat(lib: ctypes.CDLL, raw: np.ndarray, kind: str, x: np.ndarray) -> np.ndarray:
    """``x @ W^T`` by ggml for ``W`` given as ``raw`` blocks of ``kind``."""
    rows, k = x.shape
    n = raw.shape[0]
    size = raw.nbytes + 4 * x.size + 4 * rows * n + _OVERHEAD
    ctx = lib.ggml_init(InitParams(size, None, False))
    try:
        weight = lib.ggml_new_tensor_2d(ctx, GGML_TYPES[kind], k, n)  # ne0: the input width
        acts = lib.ggml_new_tensor_2d(ctx, GGML_TYPES["F32"], k, rows)
        _fill(lib, weight, raw)
        _fill(lib, acts, x.astype(np.float32))
        y = lib.ggml_mul_mat(ctx, weight, acts)
        graph = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(graph, y)
        if lib.ggml_graph_compute_with_ctx(ctx, graph, 1) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")
        out = np.empty((rows, n), np.float32)
        ctypes.memmove(out.ctypes.data, lib.ggml_get_data(y), out.nbytes)
        return out
    finally:
        lib.ggml_free(ctx)


def main() -> None:
    library, inputs, outputs = sys.argv[1:4]
    lib = load(library)
    cases = np.load(inputs)
    names = [key[len("raw_") :] for key in cases.files if key.startswith("raw_")]
    results = {
        f"y_{c}": mul_mat(lib, cases[f"raw_{c}"], str(cases[f"kind_{c}"]), cases[f"x_{c}"])
        for c in names
    }
    np.savez(outputs, **results)


if __name__ == "__main__":
    main()
