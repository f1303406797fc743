"""What the distribution declares (``pyproject.toml``) and which import names that provides.

Read by ``test_dependencies.py`` (every third-party import of the source is declared) and by
``integration/test_wheel.py`` (the plain install imports every module but its extras'). Import
names map to distributions through the metadata of this venv, which installs the base, the
``test`` extra and through it ``k8s`` and ``dashboards``; the ``gpu`` extra's are named below.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]["name"]
# The modules each runtime extra serves (``test`` is the developers' and serves none): their
# imports may need it, and without it they may fail to import.
EXTRA_COVERS = {
    "k8s": ("roundgate.k8s.tools",),
    "dashboards": ("roundgate.dashboards",),
    "gpu": ("roundgate.kernels.attention.flashinfer_backend",),
}
# Import names of distributions this venv does not install (CUDA-only).
NOT_INSTALLED_HERE = {"flashinfer": ("flashinfer-python",)}


def subpackages() -> tuple[str, ...]:
    """``setup.py``'s ``SUBPACKAGES``: the folders the wheel ships as ``roundgate.<folder>``."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    (listed,) = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "SUBPACKAGES" for t in node.targets)
    ]
    return tuple(listed)


def normalize(distribution: str) -> str:
    """PEP 503's form of a distribution's name: ``PyYAML`` and ``pyyaml`` alike."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def extra_of(module: str) -> str | None:
    """The extra whose modules include ``module``, if any."""
    for extra, prefixes in EXTRA_COVERS.items():
        if any(module == p or module.startswith(f"{p}.") for p in prefixes):
            return extra
    return None


def requirements(extra: str | None = None) -> list[Requirement]:
    """The base install's requirements, or ``extra``'s."""
    specs = PYPROJECT["project"]
    found = specs["dependencies"] if extra is None else specs["optional-dependencies"][extra]
    return [Requirement(spec) for spec in found]


@cache
def provided(extra: str | None = None) -> frozenset[str]:
    """Distributions the base install (or ``extra`` on top of it) declares: each requirement,
    and what the extras it asks for add (``ray[serve]`` brings FastAPI)."""
    found = set()
    for requirement in [*requirements(), *(requirements(extra) if extra else [])]:
        found.add(normalize(requirement.name))
        for wanted in requirement.extras:
            found |= _extra_requirements(requirement.name, wanted)
    return frozenset(found)


def distributions_of(import_name: str) -> set[str]:
    """The distributions that install the top-level import ``import_name`` (empty: unknown)."""
    installed = _installed().get(import_name, ())
    return {normalize(d) for d in (*installed, *NOT_INSTALLED_HERE.get(import_name, ()))}


def import_names(distributions: set[str]) -> set[str]:
    """The top-level import names ``distributions`` install."""
    every = {*_installed(), *NOT_INSTALLED_HERE}
    return {name for name in every if distributions_of(name) & distributions}


@cache
def _installed() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def _extra_requirements(distribution: str, extra: str) -> set[str]:
    """What ``distribution[extra]`` adds to ``distribution`` (from its installed metadata)."""
    if normalize(distribution) == PROJECT:
        return provided(extra)
    found = set()
    for spec in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(spec)
        marker = requirement.marker
        # Asked for by the extra, and not needed without it.
        if marker and marker.evaluate({"extra": extra}) and not marker.evaluate({"extra": ""}):
            found.add(normalize(requirement.name))
    return found
