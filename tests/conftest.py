"""Test-session setup: Ray on loopback, and Triton's interpreter on machines without a GPU.

Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when first imported: unset, it takes a
cluster address of ``127.0.0.1`` to mean the machine's outward address, and a driver joining
the multi-node tests' cluster dials that instead of loopback (where a sandbox may not answer).
Any unit test may import ray first, so the loopback settings go in before all of them.

Triton fixes the mode of its own ``tl`` helpers when it is first imported, so
``TRITON_INTERPRET=1`` has to be in the environment before anything imports triton: here,
first thing in the session, and only where no CUDA device exists (a GPU runs the kernels
compiled; an explicit ``TRITON_INTERPRET`` is always kept). Nothing else reads it: the
default backends never import triton, and a Triton backend on the CPU is accepted only
when it is set, which the refusal tests check by clearing it for themselves.
"""

from __future__ import annotations

import os

import pytest

from roundgate.deployment.local import use_loopback_env

use_loopback_env()

if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def kernel_device() -> str:
    """Where this test's Triton kernels run: the CPU under the interpreter, else CUDA."""
    pytest.importorskip("triton")
    import torch

    from roundgate.kernels.triton_env import interpreter_enabled

    if interpreter_enabled():
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
    return "cuda"
