"""The wheel as a user gets it: built from this tree, installed in a fresh venv beside Hugging
Face's ``kernels`` (which transformers imports, and whose name the repository's ``kernels/``
folder shares), with transformers itself. One venv for the module (building it is the cost:
about two minutes with a warm pip cache).

``constraints.txt`` pins torch to the local CPU wheel: without it, a dependency may pull a
multi-gigabyte CUDA build.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from declared_deps import (
    EXTRA_COVERS,
    REPO,
    extra_of,
    import_names,
    normalize,
    provided,
    requirements,
    subpackages,
)

pytestmark = pytest.mark.integration

BESIDE = ("kernels==0.19.1", "transformers==5.25.0")
COMMANDS = ("serve", "bench", "simulate")
# What every module of the installed distribution does on import, as JSON: the failures.
IMPORT_EVERY_MODULE = """
import importlib, importlib.metadata, json
files = [str(f) for f in importlib.metadata.distribution("roundgate").files]
modules = sorted(
    f[:-3].replace("/", ".").removesuffix(".__init__")
    for f in files
    if f.endswith(".py") and not f.endswith("__main__.py")  # scripts, run with -m
)
failed = {}
for module in modules:
    try:
        importlib.import_module(module)
    except Exception as e:
        missing = e.name if isinstance(e, ModuleNotFoundError) else None
        failed[module] = {"error": f"{type(e).__name__}: {e}", "missing": missing}
print(json.dumps({"modules": modules, "failed": failed}))
"""


@dataclass(frozen=True)
class Install:
    wheel: Path
    python: Path
    bin: Path
    outside: Path  # a folder outside the checkout, to run from

    def run(self, *argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return subprocess.run(
            [str(a) for a in argv],
            cwd=cwd or self.outside,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )


def _copy_sources(dest: Path) -> None:
    """What the wheel is built from (setuptools writes ``build/`` beside it: not in the tree)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    for folder in ("roundgate", *subpackages()):
        shutil.copytree(REPO / folder, dest / folder, ignore=ignore)


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    root = tmp_path_factory.mktemp("wheel")
    source, dist, venv = root / "source", root / "dist", root / "venv"
    source.mkdir()
    _copy_sources(source)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", dist, source], check=True)
    (wheel,) = dist.glob("roundgate-*.whl")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = venv / "bin" / "python"
    constraints = ["-c", REPO / "constraints.txt"]
    # --no-compile: byte-compiling torch and Ray's files would double the install's CPU time.
    install = [python, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-compile"]
    subprocess.run([*install, *constraints, wheel, *BESIDE], check=True, timeout=900)
    return Install(wheel, python, venv / "bin", root)


def test_the_wheel_installs_one_top_level_name(install: Install) -> None:
    with zipfile.ZipFile(install.wheel) as wheel:
        tops = {name.split("/")[0] for name in wheel.namelist()}
        (info,) = [t for t in tops if t.endswith(".dist-info")]
        record = wheel.read(f"{info}/RECORD").decode()
    assert tops == {"roundgate", info}
    assert {line.split("/")[0] for line in record.splitlines()} == {"roundgate", info}


def test_hugging_face_kernels_and_transformers_import_beside_it(install: Install) -> None:
    probe = (
        "import json, kernels, roundgate, transformers\n"
        "print(json.dumps({'kernels': kernels.__file__, 'get_kernel': hasattr(kernels, "
        "'get_kernel'), 'roundgate': roundgate.__file__, 'transformers': "
        "transformers.__version__}))"
    )
    done = install.run(install.python, "-c", probe)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    site = str(install.python.parent.parent)
    assert found["get_kernel"] and found["kernels"].startswith(site)
    assert found["roundgate"].startswith(site)
    assert found["transformers"] == BESIDE[1].partition("==")[2]


def test_no_cuda_build_came_with_it(install: Install) -> None:
    """torch is the CPU wheel ``constraints.txt`` pins, and no NVIDIA library came along."""
    (pin,) = [
        line.partition("==")[2].strip()
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if line.startswith("torch==")
    ]
    probe = (
        "import importlib.metadata as md\n"
        "print(md.version('torch'))\n"
        "print(sorted(d.metadata['Name'] for d in md.distributions() "
        "if d.metadata['Name'].lower().startswith('nvidia')))"
    )
    done = install.run(install.python, "-c", probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == [f"{pin}+cpu", "[]"]


def test_the_checkout_does_not_hide_hugging_face_kernels(install: Install) -> None:
    """Run from the repository's root (its ``kernels/`` folder first on the path): the folder
    is a namespace portion, so the installed regular package still wins."""
    probe = "import kernels; print(kernels.__file__, hasattr(kernels, 'get_kernel'))"
    done = install.run(install.python, "-c", probe, cwd=REPO)
    assert done.returncode == 0, done.stderr
    path, has_get_kernel = done.stdout.split()
    assert path.startswith(str(install.python.parent.parent)) and has_get_kernel == "True"


@pytest.mark.parametrize("command", COMMANDS)
def test_the_cli_runs(install: Install, command: str) -> None:
    done = install.run(install.bin / "roundgate", command, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_every_module_imports_but_its_extras(install: Install) -> None:
    """Without the extras, a module may fail only for want of its own extra's package."""
    done = install.run(install.python, "-c", IMPORT_EVERY_MODULE)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["modules"]) > 100
    extra_names = {
        extra: import_names({normalize(r.name) for r in requirements(extra)}) - _base_names()
        for extra in EXTRA_COVERS
    }
    wrong = {
        module: failure["error"]
        for module, failure in report["failed"].items()
        if (extra := extra_of(module)) is None
        or (failure["missing"] or "").split(".")[0] not in extra_names[extra]
    }
    assert not wrong, "modules the plain install cannot import:\n" + json.dumps(wrong, indent=1)


def _base_names() -> set[str]:
    return import_names(set(provided()))
