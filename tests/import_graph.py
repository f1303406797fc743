"""The project's modules and imports, read with ``ast`` (nothing is imported or executed).

``tests/test_layout.py`` checks the layout's promises with it (no import circle, no import up
the layers, the control plane's closure); run as a script it prints the package tree with line
counts, the largest modules and the import circles of any checkout, old layout or new:

    python tests/import_graph.py [ROOT]

What counts as an import: every ``import`` / ``from ... import`` statement, at the top of a
module or lazily inside a function (it still runs whenever the function does), relative ones
resolved against the importing module. ``from package import name`` is an import of the
submodule ``package.name`` when that is a module, else of ``package`` itself. Imports in the
body of ``if TYPE_CHECKING:`` never run: they are kept apart (``is_typing_only``), out of the
circles and the closure unless asked for (the script reports circles both ways). Left out: the
package ``__init__``
modules Python runs implicitly on the way to a submodule (``import a.b`` runs ``a``): counting
them would make every package that imports its own submodules a circle; ``closure`` adds them
back, since they do run. Imports by string (``importlib.import_module``) are not seen.

The folders at the top of ROOT but ``SCRIPT_FOLDERS`` are the subpackages of the one import
package (modules named ``roundgate.pkg.sub.mod``; ``roundgate/`` itself is its ``__init__``);
other folders of scripts (``tests``, ``benchmarks``) are read too, their modules named by path
(``tests.builders``), a bare ``import builders`` in them resolving to a sibling file first, as
pytest's and Python's script path do.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# The one import package: the folders at the top of the tree are its subpackages (``gate/``
# is ``roundgate.gate``, mapped by ``setup.py``'s ``package_dir``).
NAMESPACE = "roundgate"
# Folders of scripts and tests, not part of the package: their modules are named by path.
SCRIPT_FOLDERS = frozenset({"tests", "benchmarks"})
# A module past this many lines is listed for review in the report (not refused).
REVIEW_LINES = 500
# Folders that hold no project source, wherever they sit.
SKIP_DIRS = frozenset({".venv", "venv", "build", "dist", "node_modules", "__pycache__"})


@dataclass(frozen=True)
class Import:
    """One imported name, resolved: a project module, or a top-level name from outside."""

    source: str  # the importing module
    target: str  # a project module (``is_project``) or e.g. ``torch``
    line: int
    is_lazy: bool  # inside a function body
    is_project: bool
    is_typing_only: bool  # under ``if TYPE_CHECKING:``

    def __str__(self) -> str:
        how = ", lazy" if self.is_lazy else ""
        how += ", TYPE_CHECKING" if self.is_typing_only else ""
        return f"{self.source} -> {self.target} (line {self.line}{how})"


def source_folders(root: Path) -> tuple[str, ...]:
    """The top-level folders of ``root`` that hold Python source, sorted."""
    return tuple(
        sorted(
            d.name
            for d in root.iterdir()
            if d.is_dir()
            and not d.name.startswith(".")
            and d.name not in SKIP_DIRS
            and next(python_files(d), None) is not None
        )
    )


def python_files(folder: Path) -> Iterator[Path]:
    """Every ``.py`` file under ``folder``, skipping hidden and build folders, sorted."""
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).parts[:-1]
        if not any(p.startswith(".") or p in SKIP_DIRS for p in parts):
            yield path


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _ImportStatements(ast.NodeVisitor):
    """Every import statement of a module, with whether it sits in a function body and
    whether under ``if TYPE_CHECKING:``."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = []
        self._depth = 0
        self._typing = 0

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._typing += 1
        for statement in node.body:
            self.visit(statement)
        self._typing -= 1
        for statement in node.orelse:
            self.visit(statement)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.found.append((node, self._depth > 0, self._typing > 0))

    visit_ImportFrom = visit_Import


class ProjectGraph:
    """The modules of ``folders`` under ``root`` and what each imports."""

    def __init__(self, root: Path, folders: Iterable[str] | None = None) -> None:
        self.root = root.resolve()
        self.folders = tuple(source_folders(self.root) if folders is None else folders)
        # The project's own tree maps its folders into one namespace; another tree (the
        # tests' small examples, an old checkout) has plain packages, each with an __init__.
        self.namespace = NAMESPACE if (self.root / NAMESPACE / "__init__.py").is_file() else ""
        self.packages = tuple(
            f
            for f in self.folders
            if (self.root / f / "__init__.py").is_file()
            or (self.namespace and f not in SCRIPT_FOLDERS)
        )
        self.paths: dict[str, Path] = {}
        for folder in self.folders:
            for path in python_files(self.root / folder):
                self.paths[self._name(path)] = path
        self.trees = {
            name: ast.parse(path.read_text(encoding="utf-8"), str(path))
            for name, path in self.paths.items()
        }
        self.imports = {name: list(self._imports(name)) for name in self.paths}

    def _name(self, path: Path) -> str:
        parts = list(path.relative_to(self.root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if self.namespace and parts[0] != self.namespace and parts[0] in self.packages:
            parts.insert(0, self.namespace)
        return ".".join(parts)

    def is_package(self, module: str) -> bool:
        return self.paths[module].name == "__init__.py"

    def top(self, module: str) -> str:
        """The top-level folder a module lives in (``roundgate.gate.spec``: ``gate``)."""
        parts = module.split(".")
        nested = bool(self.namespace) and parts[0] == self.namespace and len(parts) > 1
        nested = nested and parts[1] in self.packages
        return parts[1] if nested else parts[0]

    # ---- resolving one statement ------------------------------------------------------------

    def _imports(self, module: str) -> Iterator[Import]:
        statements = _ImportStatements()
        statements.visit(self.trees[module])
        for node, lazy, typing_only in statements.found:
            for target in dict.fromkeys(self._targets(module, node)):  # once per statement
                yield Import(module, target, node.lineno, lazy, target in self.paths, typing_only)

    def _targets(self, module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield self.resolve(module, alias.name)
            return
        if node.module == "__future__":
            return
        base = self._absolute(module, node.module or "", node.level)
        for alias in node.names:
            sub = self.resolve(module, f"{base}.{alias.name}" if base else alias.name)
            yield sub if sub in self.paths else self.resolve(module, base)

    def _absolute(self, module: str, name: str, level: int) -> str:
        if level == 0:
            return name
        package = module if self.is_package(module) else module.rpartition(".")[0]
        for _ in range(level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{name}" if name else package

    def resolve(self, module: str, dotted: str) -> str:
        """The project module ``dotted`` names (the longest prefix that is one), as seen from
        ``module``; for anything else its top-level name (``torch``, ``json``)."""
        here = module.rpartition(".")[0]
        if self.top(module) not in self.packages:
            # A script folder's sibling, as on the script's path; or a module of the script
            # folder's top (pytest puts ``tests/`` on the path: ``integration.helpers``).
            for base in (here, self.top(module)):
                if f"{base}.{dotted}" in self.paths:
                    dotted = f"{base}.{dotted}"
                    break
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in self.paths:
                return ".".join(parts[:end])
        return parts[0]

    def bindings(self, module: str) -> dict[str, str]:
        """Local name -> what it names, for the module's top-level imports: a project module,
        or ``module:Name`` for a name imported from one."""
        names: dict[str, str] = {}
        for node in self.trees[module].body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = self.resolve(module, alias.name)
                    else:  # ``import a.b`` binds ``a``
                        first = alias.name.split(".")[0]
                        names[first] = self.resolve(module, first)
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = self.resolve(module, self._absolute(module, node.module or "", node.level))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    names[alias.asname or alias.name] = (
                        sub if sub in self.paths else f"{base}:{alias.name}"
                    )
        return names

    # ---- the graph ------------------------------------------------------------------------

    def project_imports(self, module: str, typing_too: bool = False) -> list[Import]:
        """The module's imports of project modules (with the typing-only ones if asked)."""
        return [
            imp
            for imp in self.imports[module]
            if imp.is_project and imp.target != module and (typing_too or not imp.is_typing_only)
        ]

    def edges(
        self, within: Iterable[str] | None = None, typing_too: bool = False
    ) -> dict[str, set[str]]:
        """Project module -> the project modules it imports, among the modules of ``within``
        (top-level folders; default: the packages)."""
        tops = set(self.packages if within is None else within)
        graph: dict[str, set[str]] = {m: set() for m in self.paths if self.top(m) in tops}
        for module in graph:
            graph[module] = {
                imp.target
                for imp in self.project_imports(module, typing_too)
                if imp.target in graph
            }
        return graph

    def circles(
        self, within: Iterable[str] | None = None, typing_too: bool = False
    ) -> list[list[str]]:
        """The import circles: each a strongly connected set of two or more modules, sorted."""
        components = _strongly_connected(self.edges(within, typing_too))
        return sorted(sorted(c) for c in components if len(c) > 1)

    def circle_imports(self, circle: Iterable[str], typing_too: bool = False) -> list[Import]:
        """The imports that close a circle: those between two of its modules."""
        members = set(circle)
        return [
            imp
            for m in sorted(members)
            for imp in self.project_imports(m, typing_too)
            if imp.target in members
        ]

    def closure(self, starts: Iterable[str]) -> dict[str, str | None]:
        """Every project module importing ``starts`` runs, lazily or not, with the module that
        first led to it (``None`` for a start): the package ``__init__`` modules on the way
        to each module are included, since Python runs them."""
        came_from: dict[str, str | None] = {}
        todo = [(s, None) for s in starts]
        while todo:
            module, parent = todo.pop()
            if module in came_from:
                continue
            came_from[module] = parent
            parts = module.split(".")
            parents = (".".join(parts[:i]) for i in range(1, len(parts)))
            todo += [(p, module) for p in parents if p in self.paths]  # not a portion
            todo += [(i.target, module) for i in self.project_imports(module)]
        return {m: p for m, p in came_from.items() if m in self.paths}

    def chain(self, came_from: dict[str, str | None], module: str) -> list[str]:
        """The path ``closure`` took from a start to ``module``."""
        path = [module]
        while (parent := came_from[path[-1]]) is not None:
            path.append(parent)
        return path[::-1]


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit to hit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components


# ---- the report ---------------------------------------------------------------------------


def tree_lines(root: Path, folders: Iterable[str]) -> list[str]:
    """Each folder (and sub-folder) with its modules and lines, indented by depth."""
    rows = []
    for folder in folders:
        counts: dict[Path, list[int]] = {}
        for path in python_files(root / folder):
            n = line_count(path)
            for d in [path.parent, *path.parent.parents]:
                if d == root:
                    break
                counts.setdefault(d, [0, 0])
                counts[d][0] += 1
                counts[d][1] += n
        for d in sorted(counts, key=lambda p: p.relative_to(root).parts):
            rel = d.relative_to(root)
            modules, lines = counts[d]
            label = "  " * (len(rel.parts) - 1) + f"{rel}/"
            rows.append(f"{label:<40} {modules:>4} modules {lines:>7} lines")
    return rows


def report(root: Path, largest: int = 15) -> str:
    graph = ProjectGraph(root)
    sizes = sorted(
        ((line_count(p), str(p.relative_to(graph.root))) for p in graph.paths.values()),
        reverse=True,
    )
    out = [f"Packages under {graph.root} (.py modules, lines):"]
    out += tree_lines(graph.root, graph.folders)
    total = sum(n for n, _ in sizes)
    out.append(f"{'total':<40} {len(sizes):>4} modules {total:>7} lines")
    out += ["", f"The {largest} largest modules:"]
    out += [f"{n:>6}  {path}" for n, path in sizes[:largest]]
    # A size is no rule: a module holds one concept, and one past ~500 lines is worth a look
    # for a second concept inside it (never split to meet a count).
    review = [f"{n:>6}  {path}" for n, path in sizes if n > REVIEW_LINES]
    out += ["", f"For review (over {REVIEW_LINES} lines: one concept, or two?): {len(review)}"]
    out += review
    for typing_too, which in ((False, "run-time imports"), (True, "TYPE_CHECKING ones too")):
        circles = graph.circles(typing_too=typing_too)
        packages = ", ".join(graph.packages)
        out += ["", f"Import circles among {packages}, counting {which}: {len(circles)}"]
        for circle in circles:
            out.append("  " + " <-> ".join(circle))
            out += [f"      {imp}" for imp in graph.circle_imports(circle, typing_too)]
    return "\n".join(out)


if __name__ == "__main__":
    print(report(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1])))
