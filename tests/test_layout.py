"""The layout's promises, checked: which parts import what, and how big a module may grow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE_DIRS = (
    "gate",
    "actors",
    "kernels",
    "deployment",
    "sim",
    "bench",
    "cli",
    "dashboards",
    "k8s",
    "benchmarks",
    "tests",
)


def _imported_after(statement: str) -> set[str]:
    """Top-level packages in ``sys.modules`` after ``statement``, in a fresh interpreter."""
    listing = "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    code = f"import sys\n{statement}\n{listing}"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


def test_the_control_plane_imports_neither_torch_nor_ray() -> None:
    modules = sorted(p.stem for p in (REPO / "actors" / "control").glob("*.py"))
    imports = "\n".join(f"import actors.control.{m}" for m in modules)
    # Building the args and a rank's core (as the simulator does) must not pull them in either.
    build = (
        "from actors.server_args import ServerArgs\n"
        "from actors.control.scheduler import Scheduler\n"
        "Scheduler(ServerArgs(dp_size=2, prefill_attempt_interval=2, "
        "prefill_any_attempt_interval=4))"
    )
    loaded = _imported_after(f"{imports}\n{build}")
    assert "actors" in loaded
    assert not loaded & {"torch", "ray", "numpy", "prometheus_client"}


def test_the_gate_is_stdlib_only() -> None:
    modules = sorted(p.stem for p in (REPO / "gate").glob("*.py"))
    loaded = _imported_after("\n".join(f"import gate.{m}" for m in modules))
    third_party = {m for m in loaded - set(sys.stdlib_module_names) if not m.startswith("_")}
    assert third_party == {"gate"}


def test_the_simulator_runs_the_control_plane_without_torch() -> None:
    loaded = _imported_after("import sim.simulator, sim.cost_executor")
    assert not loaded & {"torch", "ray"}


@pytest.mark.parametrize("folder", SOURCE_DIRS)
def test_no_module_over_500_lines(folder: str) -> None:
    long = {
        str(path.relative_to(REPO)): n
        for path in (REPO / folder).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert not long, f"split these modules: {long}"
