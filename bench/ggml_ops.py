"""ggml's own CPU operations on given inputs, called through ctypes in the library that the
``xllamacpp`` package ships (``make llamacpp``: llama.cpp and ggml statically linked, their C
API exported). The reference that the int8-dot weight path is checked against, op by op.

    python bench/ggml_ops.py LIBRARY INPUTS.npz OUTPUTS.npz

``INPUTS.npz`` holds cases ``c``: ``op_c`` (one of ``OPS``), its inputs ``a_c`` and ``b_c``,
``kind_c`` (``a``'s ggml type: ``F32``, ``I32``, or for ``mul_mat`` the block type of its raw
``[N, row bytes]`` uint8 weight) and ``params_c`` (float64, per op below). ``OUTPUTS.npz`` gets
``y_c``, each case one ggml graph computed on one thread. Shapes are numpy's (row-major: ggml's
``ne`` reversed). It imports numpy only and is run as its own process (by the interpreter of
the main venv), so llama.cpp's library never shares a process with torch's.

- ``mul_mat``: ``b @ W^T`` for ``a`` the weight ``[N, K]``, ``b`` float32 ``[B, K]``;
- ``rms_norm_mul``: ``rms_norm(a, eps) * b`` (llama.cpp's norm then its weight), params ``[eps]``;
- ``swiglu``: ``silu(a) * b``;
- ``soft_max``: ``soft_max(a * scale + b)`` over the last axis (``b`` the mask), params
  ``[scale]``;
- ``rope``: ``a`` ``[T, heads, dim]`` rotated in llama.cpp's mode 0 (adjacent pairs) at
  positions ``b`` (int32 ``[T]``), params ``[n_dims, freq_base, n_ctx_orig]``.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

OPS = ("mul_mat", "rms_norm_mul", "swiglu", "soft_max", "rope")
# ggml's enum ggml_type.
GGML_TYPES = {"F32": 0, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "I32": 26}
# Room for the graph's work buffer (x quantized to Q8_0/Q8_1) and bookkeeping.
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
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    signatures = {
        "ggml_init": ([InitParams], p),
        "ggml_new_tensor_1d": ([p, i32, i64], p),
        "ggml_new_tensor_2d": ([p, i32, i64, i64], p),
        "ggml_new_tensor_3d": ([p, i32, i64, i64, i64], p),
        "ggml_mul_mat": ([p, p, p], p),
        "ggml_rms_norm": ([p, p, f32], p),
        "ggml_mul": ([p, p, p], p),
        "ggml_swiglu_split": ([p, p, p], p),
        "ggml_soft_max_ext": ([p, p, p, f32, f32], p),
        "ggml_rope_ext": ([p, p, p, p, i32, i32, i32, f32, f32, f32, f32, f32, f32], p),
        "ggml_new_graph": ([p], p),
        "ggml_build_forward_expand": ([p, p], None),
        "ggml_graph_compute_with_ctx": ([p, p, i32], i32),
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


def _tensor(lib: ctypes.CDLL, ctx: int, array: np.ndarray, kind: str, width: int = 0) -> int:
    """A ggml tensor holding ``array``; ``width``: the row length of raw block data."""
    ne = array.shape[::-1] if kind in ("F32", "I32") else (width, array.shape[0])
    make = {
        1: lib.ggml_new_tensor_1d,
        2: lib.ggml_new_tensor_2d,
        3: lib.ggml_new_tensor_3d,
    }[len(ne)]
    tensor = make(ctx, GGML_TYPES[kind], *ne)
    data = np.ascontiguousarray(array)
    if data.nbytes != lib.ggml_nbytes(tensor):
        raise ValueError(f"{data.nbytes} bytes for a {kind} tensor of {lib.ggml_nbytes(tensor)}")
    ctypes.memmove(lib.ggml_get_data(tensor), data.ctypes.data, data.nbytes)
    return tensor


def _graph(lib: ctypes.CDLL, ctx: int, a: int, b: int, op: str, params: np.ndarray) -> int:
    if op == "mul_mat":
        return lib.ggml_mul_mat(ctx, a, b)
    if op == "rms_norm_mul":
        return lib.ggml_mul(ctx, lib.ggml_rms_norm(ctx, a, float(params[0])), b)
    if op == "swiglu":
        return lib.ggml_swiglu_split(ctx, a, b)
    if op == "soft_max":
        return lib.ggml_soft_max_ext(ctx, a, b, float(params[0]), 0.0)
    if op == "rope":
        n_dims, base, n_ctx_orig = int(params[0]), float(params[1]), int(params[2])
        # mode 0, freq_scale 1, ext_factor 0, attn_factor 1, beta_fast 32, beta_slow 1: what
        # llama.cpp passes for a llama model without rope scaling.
        return lib.ggml_rope_ext(ctx, a, b, None, n_dims, 0, n_ctx_orig, base, 1, 0, 1, 32, 1)
    raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")


def run(
    lib: ctypes.CDLL, op: str, a: np.ndarray, b: np.ndarray, kind: str, params: np.ndarray
) -> np.ndarray:
    """One op computed by ggml on one thread."""
    if op == "mul_mat":
        out_shape: tuple[int, ...] = (b.shape[0], a.shape[0])
        width = b.shape[1]
    else:
        out_shape, width = a.shape, 0
    size = a.nbytes + b.nbytes + 4 * int(np.prod(out_shape)) * 2 + _OVERHEAD
    ctx = lib.ggml_init(InitParams(size, None, False))
    try:
        ta = _tensor(lib, ctx, a, kind, width)
        tb = _tensor(lib, ctx, b, "I32" if op == "rope" else "F32")
        y = _graph(lib, ctx, ta, tb, op, params)
        graph = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(graph, y)
        if lib.ggml_graph_compute_with_ctx(ctx, graph, 1) != 0:
            raise RuntimeError(f"ggml failed to compute {op}")
        out = np.empty(out_shape, np.float32)
        ctypes.memmove(out.ctypes.data, lib.ggml_get_data(y), out.nbytes)
        return out
    finally:
        lib.ggml_free(ctx)


def library_path(venv: Path) -> Path | None:
    """xllamacpp's library in the venv ``make llamacpp`` builds, if it is there."""
    found = sorted(venv.glob("lib/python*/site-packages/xllamacpp/xllamacpp*.so"))
    return found[0] if found else None


def compute(library: Path, cases: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``cases`` (the keys of ``INPUTS.npz`` above) computed by ggml in a child process."""
    with tempfile.TemporaryDirectory() as folder:
        inputs, outputs = Path(folder, "in.npz"), Path(folder, "out.npz")
        np.savez(inputs, **cases)
        command = [sys.executable, __file__, str(library), str(inputs), str(outputs)]
        subprocess.run(command, check=True, timeout=300)
        with np.load(outputs) as results:
            return {key: results[key] for key in results.files}


def main() -> None:
    library, inputs, outputs = sys.argv[1:4]
    lib = load(library)
    cases = np.load(inputs)
    names = [key[len("op_") :] for key in cases.files if key.startswith("op_")]
    results = {}
    for c in names:
        op, kind = str(cases[f"op_{c}"]), str(cases[f"kind_{c}"])
        results[f"y_{c}"] = run(
            lib, op, cases[f"a_{c}"], cases[f"b_{c}"], kind, cases[f"params_{c}"]
        )
    np.savez(outputs, **results)


if __name__ == "__main__":
    main()
