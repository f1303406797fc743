"""The project's classes, read with ``ast``: each base resolved through the module's imports
(re-exports followed) to a project class or an outside name, which classes are records (their
annotations are fields), and which attributes a class sets. ``tests/test_layout.py`` checks
with it that no class is assembled from several project classes and that no annotation stands
in for state another class owns.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from import_graph import ProjectGraph

# Bases (by their own name) whose classes declare fields by annotation: a class with one of
# these among its ancestors, or decorated as a dataclass, owns its annotated attributes.
RECORD_BASES = frozenset(
    {
        "NamedTuple",
        "TypedDict",
        "Protocol",
        "Enum",
        "IntEnum",
        "StrEnum",
        "Flag",
        "IntFlag",
        "BaseModel",
        "RootModel",
        "BaseSettings",
    }
)
ClassKey = tuple[str, str]  # (module, class name) of a top-level class


class Classes:
    """Every class of the project, with its bases resolved through the modules' imports."""

    def __init__(self, graph: ProjectGraph) -> None:
        self.graph = graph
        self.defs: dict[ClassKey, ast.ClassDef] = {
            (module, node.name): node
            for module, tree in graph.trees.items()
            for node in tree.body
            if isinstance(node, ast.ClassDef)
        }
        self.bindings = {module: graph.bindings(module) for module in graph.trees}

    def every(self) -> Iterator[tuple[str, ast.ClassDef]]:
        """Each class (nested ones included) with its module."""
        for module, tree in self.graph.trees.items():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    yield module, node

    def find(self, module: str, name: str, hops: int = 0) -> ClassKey | str:
        """The project class ``name`` means in ``module`` (following re-exports), else the
        bare name (a class from outside the project, or one defined in a function)."""
        if (module, name) in self.defs or hops > 8:
            return (module, name)
        target = self.bindings[module].get(name, "")
        source, _, imported = target.partition(":")
        if imported and source in self.graph.paths:
            return self.find(source, imported, hops + 1)
        return imported or name

    def base(self, module: str, expr: ast.expr) -> ClassKey | str:
        if isinstance(expr, ast.Subscript | ast.Call):  # Protocol[T], Generic[T]
            return self.base(module, expr.value if isinstance(expr, ast.Subscript) else expr.func)
        if isinstance(expr, ast.Name):
            return self.find(module, expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.bindings[module].get(getattr(expr.value, "id", ""), "")
            return self.find(owner, expr.attr) if owner in self.graph.paths else expr.attr
        return ast.unparse(expr)

    def project_bases(self, module: str, node: ast.ClassDef) -> list[ClassKey]:
        bases = [self.base(module, b) for b in node.bases]
        return [b for b in bases if isinstance(b, tuple) and b in self.defs]

    def is_record(self, module: str, node: ast.ClassDef, depth: int = 0) -> bool:
        """A dataclass, NamedTuple, Protocol, TypedDict, Enum or pydantic model (or a subclass
        of one): its annotations are its fields."""
        if any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            return True
        for expr in node.bases:
            base = self.base(module, expr)
            if isinstance(base, str) and base in RECORD_BASES:
                return True
            if (
                isinstance(base, tuple)
                and depth < 16
                and self.is_record(base[0], self.defs[base], depth + 1)
            ):
                return True
        return False

    def assigned(self, module: str, node: ast.ClassDef, depth: int = 0) -> set[str]:
        """``self.<name>`` the class or a project ancestor assigns (``object.__setattr__``
        included)."""
        names = set()
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.ctx, ast.Store)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
            ):
                names.add(sub.attr)
            if isinstance(sub, ast.Call) and ast.unparse(sub.func).endswith("setattr"):
                args = sub.args
                if len(args) >= 2 and isinstance(args[1], ast.Constant):
                    names.add(str(args[1].value))
        for base in self.project_bases(module, node):
            if depth < 16:
                names |= self.assigned(base[0], self.defs[base], depth + 1)
        return names


def annotation_only(node: ast.ClassDef) -> list[ast.AnnAssign]:
    """The class-level annotations without a value (``ClassVar`` ones aside)."""
    return [
        s
        for s in node.body
        if isinstance(s, ast.AnnAssign)
        and s.value is None
        and isinstance(s.target, ast.Name)
        and "ClassVar" not in ast.unparse(s.annotation)
    ]
