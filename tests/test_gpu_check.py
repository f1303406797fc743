"""``benchmarks/gpu_check.sh`` / ``gpu_check.py`` run only on a lent GPU; here: the script parses,
and the FP8 parity and backend checks run on small shapes under Triton's interpreter (the same
code the GPU runs at DeepSeek-V3's widths), failing loudly where they should."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks/gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shell_script_parses() -> None:
    subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "gpu_check.sh")], check=True)


def test_fp8_parity_passes_on_small_shapes(kernel_device: str) -> None:
    gpu_check = load_gpu_check()
    results = gpu_check.fp8_parity(kernel_device, [(3, 130, 260)], (130, 96, [2, 0, 3]))
    assert set(results) == {"gemm_3x130x260", "experts_3x96x130"}
    assert all(row["ok"] for row in results.values()), results


def test_a_backend_auto_cannot_fuse_is_a_failure() -> None:
    gpu_check = load_gpu_check()
    backends = gpu_check.chosen_backends("cpu")  # no CUDA: every pick is the reference
    report = {"fp8_parity": {"gemm": {"ok": True}}, "backends": backends}
    failures = gpu_check._failures(report)
    assert any(f.startswith("backends.mla_attention") for f in failures)
    assert any(f.startswith("backends.moe_backend_8_ranks") for f in failures)


@pytest.mark.parametrize("step", ["sm90_report", "SKIPPED", "fp8"])
def test_the_script_runs_the_new_steps(step: str) -> None:
    assert step in (REPO / "benchmarks" / "gpu_check.sh").read_text()
