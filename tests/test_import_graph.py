"""The ast readers behind ``test_layout.py``, on tiny trees: what counts as an import and a
circle, what the closure reaches, how class bases resolve."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from class_graph import Classes, annotation_only
from import_graph import ProjectGraph, report


def make_tree(root: Path, files: dict[str, str]) -> ProjectGraph:
    """Write ``files`` (path -> source) under ``root``, every folder of ``a``/``b`` a package."""
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    for top in ("a", "b"):
        for folder in [root / top, *(p for p in (root / top).rglob("*") if p.is_dir())]:
            if folder.is_dir() and not (folder / "__init__.py").exists():
                (folder / "__init__.py").write_text("")
    return ProjectGraph(root)


def lazy(target: str) -> str:
    return f"def f():\n    import {target}\n"


@pytest.mark.parametrize(
    ("files", "circles", "typing_circles"),
    [
        # A top-level import one way, a lazy one back: a circle.
        ({"a/x.py": "import a.y\n", "a/y.py": lazy("a.x")}, [["a.x", "a.y"]], None),
        # ``from package import submodule`` is an import of the submodule.
        ({"a/x.py": "from a import y\n", "a/y.py": "from a import x\n"}, [["a.x", "a.y"]], None),
        # ``from package import name`` is an import of the package's ``__init__``.
        (
            {"a/__init__.py": "from a.x import f\n", "a/x.py": "from a import CONST\n"},
            [["a", "a.x"]],
            None,
        ),
        # Relative imports resolve against the importing module.
        ({"a/x.py": "from .y import f\n", "a/y.py": "from . import x\n"}, [["a.x", "a.y"]], None),
        ({"a/s/x.py": "from ..y import f\n", "a/y.py": "import a.s.x\n"}, [["a.s.x", "a.y"]], None),
        # A chain is no circle; importing one's own package is no circle either.
        ({"a/x.py": "import a.y\n", "a/y.py": "import b.z\n", "b/z.py": ""}, [], None),
        ({"a/__init__.py": "from a import x\n", "a/x.py": ""}, [], None),
        # A type-only import back: no circle at run time, one when typing counts.
        (
            {
                "a/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.y\n",
                "a/y.py": "import a.x\n",
            },
            [],
            [["a.x", "a.y"]],
        ),
    ],
)
def test_circles(
    tmp_path: Path,
    files: dict[str, str],
    circles: list[list[str]],
    typing_circles: list[list[str]] | None,
) -> None:
    graph = make_tree(tmp_path, files)
    assert graph.circles() == circles
    assert graph.circles(typing_too=True) == (circles if typing_circles is None else typing_circles)


def test_an_import_records_where_and_how(tmp_path: Path) -> None:
    graph = make_tree(
        tmp_path,
        {
            "a/x.py": "import json\nfrom torch import nn\n" + lazy("a.y.w") + "import a.y, b\n",
            "a/y.py": "",
            "b/z.py": "",
        },
    )
    found = {(i.target, i.is_lazy, i.is_project) for i in graph.imports["a.x"]}
    # ``a.y.w`` is no module: the longest prefix that is one is imported.
    assert found == {
        ("json", False, False),
        ("torch", False, False),
        ("a.y", True, True),
        ("a.y", False, True),
        ("b", False, True),
    }


def test_the_closure_follows_lazy_imports_and_runs_packages(tmp_path: Path) -> None:
    graph = make_tree(
        tmp_path,
        {
            "a/s/m.py": lazy("b.n"),
            "b/__init__.py": "import torch\n",
            "b/n.py": "",
            "a/t.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b.n\n",
        },
    )
    came_from = graph.closure(["a.s.m"])
    assert set(came_from) == {"a", "a.s", "a.s.m", "b", "b.n"}
    assert graph.chain(came_from, "b") == ["a.s.m", "b.n", "b"]
    assert set(graph.closure(["a.t"])) == {"a", "a.t"}  # a type-only import never runs


def test_a_script_folder_imports_its_siblings(tmp_path: Path) -> None:
    graph = make_tree(
        tmp_path,
        {"tests/t.py": "import helper\nimport a\n", "tests/helper.py": "", "a/x.py": ""},
    )
    assert graph.packages == ("a",)
    assert {i.target for i in graph.imports["tests.t"]} == {"tests.helper", "a"}
    assert "Import circles among a" in report(tmp_path)


# --- classes ----------------------------------------------------------------------------------

CLASSES = {
    "a/base.py": """
        from dataclasses import dataclass
        from typing import NamedTuple, Protocol
        from pydantic import BaseModel

        class Plain:
            def __init__(self):
                self.x = 1

        class Other:
            pass

        @dataclass
        class Record:
            x: int

        class Row(NamedTuple):
            x: int

        class Model(BaseModel):
            x: int

        class Shape(Protocol):
            x: int
        """,
    "a/__init__.py": "from a.base import Plain\n",
    "b/use.py": """
        import a.base as base
        from typing import Protocol
        from a import Plain
        from a.base import Model, Other

        class Mixed(Plain, base.Other):
            pass

        class Typed(Plain, Protocol):
            pass

        class Child(Plain):
            x: int  # set by the ancestor

        class Stub:
            x: int  # set by nobody here

        class Request(Model):
            y: int
        """,
}


@pytest.mark.parametrize(
    ("module", "name", "bases", "is_record", "stubs"),
    [
        ("b.use", "Mixed", ["Plain", "Other"], False, []),  # through a re-export and an alias
        ("b.use", "Typed", ["Plain"], True, []),  # a Protocol
        ("b.use", "Child", ["Plain"], False, []),
        ("b.use", "Stub", [], False, ["x"]),
        ("b.use", "Request", ["Model"], True, []),  # a pydantic model's subclass
        ("a.base", "Record", [], True, []),
        ("a.base", "Row", [], True, []),
        ("a.base", "Shape", [], True, []),
        ("a.base", "Plain", [], False, []),
    ],
)
def test_classes(
    tmp_path: Path, module: str, name: str, bases: list[str], is_record: bool, stubs: list[str]
) -> None:
    classes = Classes(make_tree(tmp_path, CLASSES))
    node = classes.defs[(module, name)]
    assert [b[1] for b in classes.project_bases(module, node)] == bases
    assert classes.is_record(module, node) is is_record
    assigned = classes.assigned(module, node)
    found = [s.target.id for s in annotation_only(node) if isinstance(s.target, ast.Name)]
    assert [n for n in found if n not in assigned and not is_record] == stubs
