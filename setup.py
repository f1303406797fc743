"""The package layout, which ``pyproject.toml`` cannot state: one import package ``roundgate``
whose subpackages are the repository's top-level folders (``gate/`` is ``roundgate.gate``).

Everything else about the distribution (metadata, dependencies, extras, scripts) is in
``pyproject.toml``. ``SUBPACKAGES`` is the one list of folders that ship;
``tests/test_layout.py`` holds it to the tree. ``kernels/`` is a namespace portion
(no ``__init__.py``; ``roundgate/__init__.py`` says why), every other folder a package.
"""

from setuptools import find_packages, setup

SUBPACKAGES = (
    "actors",
    "bench",
    "cli",
    "dashboards",
    "deployment",
    "gate",
    "k8s",
    "kernels",
    "nccl_log",
    "routing",
    "sim",
)


def _packages() -> list[str]:
    found = ["roundgate"]
    for name in SUBPACKAGES:
        found.append(f"roundgate.{name}")
        found += [f"roundgate.{name}.{p}" for p in find_packages(where=name)]
    return [*found, *DATA_FOLDERS]


# Folders of data files only, shipped as they are (``pyproject.toml``'s package-data).
DATA_FOLDERS = ("roundgate.deployment.configs",)


setup(
    packages=_packages(),
    package_dir={"roundgate": "roundgate", **{f"roundgate.{n}": n for n in SUBPACKAGES}},
)
