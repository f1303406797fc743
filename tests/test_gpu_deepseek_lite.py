"""``benchmarks/gpu_deepseek_lite.py`` runs at full width only on a lent GPU; here: its
``--tiny`` model on CPU reports every configuration with the eager tokens, tokens/s and the
round's parts, its verdicts fail and skip where they should, and ``gpu_check.sh`` runs it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_deepseek_lite.py"
PARTS = ("schedule", "gather", "forward", "finish", "host_round")


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_deepseek_lite", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("lite") / "lite.json"
    flags = ["--prompts", "4", "--prompt-len", "24", "--max-tokens", "8"]
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out), *flags]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_every_configuration_is_reported(report: dict[str, Any]) -> None:
    script = load_script()
    assert set(report["configs"]) == set(script.CONFIGS)
    assert report["failures"] == []
    for name, row in report["configs"].items():
        if "async_scheduling" in row["flags"] and not report["overlap_available"]:
            assert row["skipped"] == script.NO_OVERLAP  # said, and in the skipped list
            assert any(s.startswith(f"{name}: ") for s in report["skipped"])
        else:
            assert "skipped" not in row and "error" not in row, row


def test_each_run_gives_the_eager_tokens_at_a_rate(report: dict[str, Any]) -> None:
    ran = {k: v for k, v in report["configs"].items() if "skipped" not in v}
    assert {"eager", "graphs"} <= set(ran)
    for row in ran.values():
        assert row["same_as_eager"] and row["first_mismatch"] is None
        assert row["generated_tokens"] == 4 * 8
        assert row["decode_tokens_per_s"] > 0
        assert row["graphs_captured"] is False  # CPU: never, and said why
        assert row["why_eager"]


def test_the_rounds_parts_are_timed(report: dict[str, Any]) -> None:
    for row in report["configs"].values():
        if "skipped" in row:
            continue
        rounds = row["rounds"]
        assert rounds["num_decode_rounds"] == 7  # one prefill round, then 7 decodes
        for part in PARTS:
            stats = rounds["ms"][part]
            assert 0 <= stats["median"] <= stats["p90"], (part, stats)
        assert rounds["ms"]["forward"]["median"] > 0
        assert rounds["ms"]["gpu_round"] is None  # CUDA events only on CUDA


def _row(**kw: Any) -> dict[str, Any]:
    row = {
        "flags": {"enforce_eager": False},
        "attention": "triton",
        "experts": "triton_run_experts",
        "graphs_captured": True,
        "why_eager": None,
        "same_as_eager": True,
        "first_mismatch": None,
        "rounds": {"num_decode_rounds": 7, "num_gpu_timed_rounds": 7},
    }
    return row | kw


@pytest.mark.parametrize(
    ("row", "device", "failed", "skipped"),
    [
        (_row(), "cuda", False, False),
        (_row(same_as_eager=False, first_mismatch="prompt 0, token 3"), "cuda", True, False),
        (_row(error="RuntimeError('x')"), "cuda", True, False),
        (_row(attention="torch"), "cuda", True, False),
        (_row(rounds={"num_decode_rounds": 0, "num_gpu_timed_rounds": 0}), "cpu", True, False),
        (_row(rounds={"num_decode_rounds": 7, "num_gpu_timed_rounds": 0}), "cuda", True, False),
        (_row(graphs_captured=False, why_eager="MoE dispatch reads"), "cuda", False, True),
        (_row(graphs_captured=False, attention="torch", experts="run_experts"), "cpu", 0, 0),
        ({"flags": {"async_scheduling": True}, "skipped": "overlap: no"}, "cpu", False, True),
    ],
)
def test_verdicts(row: dict[str, Any], device: str, failed: bool, skipped: bool) -> None:
    failures, skips = load_script().failures_of({"configs": {"c": row}}, device)
    assert bool(failures) == failed, failures
    assert bool(skips) == skipped, skips


def test_gpu_check_runs_it_and_parses() -> None:
    sh = REPO / "benchmarks" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(sh)], check=True)
    text = sh.read_text()
    assert "benchmarks/gpu_deepseek_lite.py --out" in text
    assert '"deepseek_lite"' in text
