"""Every third-party import of the package is declared: by the base install, or by the extra
that serves the module (``declared_deps.EXTRA_COVERS``). Read with ``ast``, so a lazy import
inside a function counts; an import under ``if TYPE_CHECKING:`` (never run) or guarded by
``try: ... except ImportError`` (optional by construction) does not.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from declared_deps import (
    EXTRA_COVERS,
    PYPROJECT,
    REPO,
    distributions_of,
    extra_of,
    provided,
    subpackages,
)

NAMESPACE = "roundgate"
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


def package_modules() -> dict[str, Path]:
    """Every module of the wheel by its import name."""
    found = {}
    for folder in (NAMESPACE, *subpackages()):
        prefix = NAMESPACE if folder == NAMESPACE else f"{NAMESPACE}.{folder}"
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((prefix, *parts))] = path
    return found


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        kinds = handler.type
        names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
        if any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names):
            return True
    return False


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def required_imports(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """``(top-level name, line)`` of each absolute import that runs and is not optional."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (i for child in node.orelse for i in required_imports(_wrap(child)))
            continue
        if isinstance(node, ast.Try) and _catches_import_error(node):
            rest = [*node.handlers, *node.orelse, *node.finalbody]
            yield from (i for child in rest for i in required_imports(_wrap(child)))
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name.split(".")[0], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], node.lineno
        else:
            yield from required_imports(node)


def _wrap(node: ast.AST) -> ast.Module:
    return ast.Module(body=[node], type_ignores=[])


def third_party(name: str) -> bool:
    return name not in sys.stdlib_module_names and name not in (NAMESPACE, "__future__")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch\nimport os\n", ["torch"]),
        ("from yaml import safe_load\nfrom . import sibling\n", ["yaml"]),
        ("def f():\n    import triton.language as tl\n", ["triton"]),  # lazy still runs
        ("if TYPE_CHECKING:\n    import ray\nelse:\n    import numpy\n", ["numpy"]),
        ("try:\n    import flashinfer\nexcept ImportError:\n    import numpy\n", ["numpy"]),
        ("try:\n    import flashinfer\nexcept (OSError, ModuleNotFoundError):\n    pass\n", []),
        ("try:\n    import flashinfer\nexcept OSError:\n    pass\n", ["flashinfer"]),
        ("import roundgate.gate.registry\nimport sys\n", []),
    ],
)
def test_the_reader_finds_the_required_imports(source: str, expected: list[str]) -> None:
    tree = ast.parse(textwrap.dedent(source))
    assert [name for name, _ in required_imports(tree) if third_party(name)] == expected


def test_every_runtime_extra_serves_modules_that_exist() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"]) - {"test"}
    assert set(EXTRA_COVERS) == extras
    modules = package_modules()
    for extra, prefixes in EXTRA_COVERS.items():
        for prefix in prefixes:
            assert any(extra_of(m) == extra for m in modules if m.startswith(prefix)), prefix


def test_every_third_party_import_is_declared() -> None:
    unknown, undeclared = [], []
    for module, path in package_modules().items():
        extra = extra_of(module)
        allowed = provided(extra)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, line in required_imports(tree):
            if not third_party(name):
                continue
            where = f"{path.relative_to(REPO)}:{line} imports {name}"
            distributions = distributions_of(name)
            if not distributions:
                unknown.append(where)
            elif not distributions & allowed:
                scope = "the base install" + (f" or [{extra}]" if extra else "")
                undeclared.append(f"{where} ({', '.join(sorted(distributions))}): not in {scope}")
    assert not unknown, "imports of no installed distribution:\n" + "\n".join(unknown)
    assert not undeclared, "undeclared dependencies:\n" + "\n".join(undeclared)
