"""Where a Triton kernel may run: on CUDA, or on CPU under Triton's interpreter.

With ``TRITON_INTERPRET=1`` in the environment, ``triton.jit`` builds *interpreted* kernels:
every program of the grid runs in Python over CPU tensors (numpy underneath). It is slow,
but it is the same kernel source, so CI checks a kernel's indexing, masking and online
softmax without a GPU. The variable must be set before the process imports triton (its own
``tl.sum``/``tl.max`` are jitted at that import, in the mode of that moment); the test
suite's ``tests/conftest.py`` sets it first thing on a machine without CUDA.

Stdlib only: ``ServerArgs`` asks it in every process (the ingress too) without importing
torch or triton; triton itself is imported only when a Triton backend is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

INTERPRET_ENV = "TRITON_INTERPRET"
# The values Triton's own reader (``knobs.runtime.interpret``) takes as true.
_TRUE = ("1", "true", "on")


def interpreter_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TRITON_INTERPRET`` asks Triton to interpret kernels (read at each call)."""
    env = os.environ if environ is None else environ
    return env.get(INTERPRET_ENV, "").strip().lower() in _TRUE


def check_triton_device(
    flag: str, device_kind: str, environ: Mapping[str, str] | None = None
) -> None:
    """Refuse a Triton backend where its kernels cannot run: ``ValueError`` naming ``flag``.

    CUDA runs them compiled; a CPU runs them only interpreted (``TRITON_INTERPRET=1``).
    """
    if device_kind == "cuda" or interpreter_enabled(environ):
        return
    raise ValueError(
        f"{flag} triton needs a CUDA device, got {device_kind} (on CPU its kernels run only "
        f"under Triton's interpreter: set {INTERPRET_ENV}=1, for tests)"
    )


def tile_width(n: int, minimum: int = 16) -> int:
    """A tile dimension covering ``n``: a power of two (Triton's rule for ``tl.arange``), at
    least ``minimum`` (``tl.dot`` needs 16 rows and columns on a GPU); extra lanes are masked."""
    return max(minimum, 1 << max(n - 1, 0).bit_length())
