"""Choosing the Triton backends: where they are accepted, how they are refused, and that the
default path never imports triton.

On a machine without CUDA the Triton kernels run only under Triton's interpreter
(``TRITON_INTERPRET=1``, which ``tests/conftest.py`` sets for the session there); each
refusal test clears it for itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.server_args import ServerArgs
from roundgate.cli.engine_flags import parse_server_args, to_argv
from roundgate.kernels.attention.registry import build_latent as select_latent_attention_backend
from roundgate.kernels.attention.registry import resolve as resolve_attention_backend
from roundgate.kernels.moe.base import run_experts
from roundgate.kernels.moe.registry import experts_kernel as select_experts_kernel
from roundgate.kernels.triton_env import check_triton_device, interpreter_enabled

REPO = Path(__file__).resolve().parents[1]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")


@pytest.fixture
def no_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture
def interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize(
    ("value", "enabled"),
    [("1", True), ("true", True), ("ON", True), ("0", False), ("", False), ("yes", False)],
)
def test_the_interpreter_switch_reads_like_tritons_own(value: str, enabled: bool) -> None:
    assert interpreter_enabled({"TRITON_INTERPRET": value}) is enabled


@pytest.mark.parametrize(
    ("flags", "culprit"),
    [
        ({"attention_backend": "triton"}, "--attention-backend triton"),
        ({"moe_kernel": "triton"}, "--moe-kernel triton"),
    ],
)
def test_cpu_without_the_interpreter_refuses_triton(no_interpreter, flags, culprit) -> None:
    with pytest.raises(ValueError, match=f"{culprit} needs a CUDA device.*TRITON_INTERPRET=1"):
        ServerArgs(model="tiny-llama", device="cpu", **flags)


def test_cpu_under_the_interpreter_accepts_triton(interpreter) -> None:
    args = ServerArgs(
        model="tiny-llama", device="cpu", attention_backend="triton", moe_kernel="triton"
    )
    assert (args.attention_backend, args.moe_kernel) == ("triton", "triton")
    assert parse_server_args(to_argv(args)) == args


@NO_CUDA
def test_auto_device_is_refused_by_the_runner(no_interpreter) -> None:
    """``--device auto`` may find CUDA on a rank, so ServerArgs leaves it to the runner."""
    args = ServerArgs(model="tiny-llama", attention_backend="triton", num_kv_pages=4)
    with pytest.raises(ValueError, match="--attention-backend triton needs a CUDA device"):
        ModelRunner(args)


@pytest.mark.parametrize(
    ("call", "culprit"),
    [
        (lambda: resolve_attention_backend("triton", "cpu"), "--attention-backend"),
        (lambda: select_latent_attention_backend("triton", "cpu"), "--attention-backend"),
        (lambda: select_experts_kernel("triton", "cpu"), "--moe-kernel"),
        (lambda: check_triton_device("--moe-kernel", "cpu"), "--moe-kernel"),
    ],
)
def test_kernel_selection_refuses_cpu_without_the_interpreter(no_interpreter, call, culprit):
    with pytest.raises(ValueError, match=f"{culprit} triton needs a CUDA device"):
        call()


def test_kernel_selection_under_the_interpreter(interpreter) -> None:
    assert resolve_attention_backend("triton", "cpu") == "triton"
    assert select_latent_attention_backend("triton", "cpu").name == "triton"
    assert select_latent_attention_backend("auto", "cpu").name == "torch"
    assert select_experts_kernel("torch", "cpu") is run_experts
    assert select_experts_kernel("triton", "cpu").__name__ == "triton_run_experts"
    with pytest.raises(ValueError, match="the 'triton' package is not installed"):
        select_experts_kernel("triton", "cpu", available=lambda module: False)
    with pytest.raises(ValueError, match="--moe-kernel must be one of auto, torch, triton"):
        select_experts_kernel("cutlass", "cpu")


def test_the_default_path_never_imports_triton() -> None:
    """The serving app's import and a default Engine's generate load no triton (a fresh
    interpreter; the session's TRITON_INTERPRET changes nothing on this path)."""
    code = (
        "import sys\n"
        "import roundgate.deployment.app\n"
        "from roundgate.actors.engine import Engine\n"
        "from roundgate.actors.server_args import ServerArgs\n"
        "engine = Engine(ServerArgs(model='tiny-moe', device='cpu', num_kv_pages=8))\n"
        "engine.generate([[1, 2, 3]])\n"
        "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('triton.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
