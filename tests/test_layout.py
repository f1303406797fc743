"""The layout's promises, checked: what imports what, how big a module grows, how classes are
built. The static checks read every module with ``ast`` (``tests/import_graph.py``), so a lazy
import inside a function counts as much as one at the top; imports under ``if TYPE_CHECKING:``
count for circles and layers (a type-only import is still a dependency in the design) but not
for what the control plane loads, since they never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from class_graph import Classes, annotation_only
from declared_deps import subpackages
from import_graph import ProjectGraph

from roundgate.routing import registry as routers

REPO = Path(__file__).resolve().parents[1]
# Lowest first: a package may import from its own layer and the ones below, never above.
# ``nccl_log`` (the nccl-tests log, stdlib only) is read by the operators' tools (k8s) and by
# the simulator's calibration alike; ``routing`` (the routing policies, no Ray) by the Serve
# routers (deployment) and the simulator alike; so ``sim`` sits below ``deployment`` and
# ``k8s``: it runs the control plane and the routing policies without either.
LAYERS = (
    "nccl_log",
    "gate",
    "kernels",
    "actors",
    "routing",
    "sim",
    "deployment",
    "k8s",
    "bench",
    "cli",
    "roundgate",  # the namespace's own modules: its __init__ and ``python -m roundgate``
)
STANDALONE = ("dashboards",)  # imports no other package, and none imports it
PACKAGES = (*LAYERS, *STANDALONE)
SOURCE_DIRS = (*PACKAGES, "benchmarks", "tests")
HEAVY = frozenset({"torch", "ray", "numpy", "prometheus_client"})


@pytest.fixture(scope="module")
def graph() -> ProjectGraph:
    return ProjectGraph(REPO, SOURCE_DIRS)


def _imported_after(statement: str) -> set[str]:
    """Top-level packages in ``sys.modules`` after ``statement``, in a fresh interpreter
    (``-P``: without the checkout on its path, so only ``roundgate.`` names import, as for a
    user of the wheel)."""
    listing = "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    code = f"import sys\n{statement}\n{listing}"
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


# --- what actually loads (a fresh interpreter) ----------------------------------------------


def test_the_control_plane_imports_neither_torch_nor_ray() -> None:
    modules = sorted(p.stem for p in (REPO / "actors" / "control").glob("*.py"))
    imports = "\n".join(f"import roundgate.actors.control.{m}" for m in modules)
    # Building the args and a rank's core (as the simulator does) must not pull them in either.
    build = (
        "from roundgate.actors.server_args import ServerArgs\n"
        "from roundgate.actors.control.scheduler import Scheduler\n"
        "Scheduler(ServerArgs(dp_size=2, prefill_attempt_interval=2, "
        "prefill_any_attempt_interval=4))"
    )
    loaded = _imported_after(f"{imports}\n{build}")
    assert "roundgate" in loaded
    assert not loaded & HEAVY


def test_the_gate_is_stdlib_only() -> None:
    modules = sorted(p.stem for p in (REPO / "gate").glob("*.py"))
    loaded = _imported_after("\n".join(f"import roundgate.gate.{m}" for m in modules))
    third_party = {m for m in loaded - set(sys.stdlib_module_names) if not m.startswith("_")}
    assert third_party == {"roundgate"}


def test_the_simulator_runs_the_control_plane_without_torch() -> None:
    loaded = _imported_after(
        "import roundgate.sim.spec, roundgate.sim.simulator, roundgate.sim.cost_executor"
    )
    assert not loaded & {"torch", "ray"}


# --- what the source says (ast) -------------------------------------------------------------


def test_every_source_folder_is_read(graph: ProjectGraph) -> None:
    assert set(graph.packages) == set(PACKAGES)
    assert {graph.top(m) for m in graph.paths} == set(SOURCE_DIRS)


def test_no_bare_import_of_a_subpackage(graph: ProjectGraph) -> None:
    """Every import of the project's code spells the one package: ``roundgate.gate``, never
    ``gate`` (which would resolve only from the repository root, and in an installed wheel
    not at all, or to another distribution's module of that name: Hugging Face's
    ``kernels``). Tests and benchmarks too."""
    bare = [
        str(imp)
        for module in graph.paths
        for imp in graph.imports[module]
        if imp.target in PACKAGES and imp.target != "roundgate"
    ]
    assert not bare, "bare imports of the package's folders:\n" + "\n".join(bare)


def test_pytest_puts_no_repository_root_on_the_path() -> None:
    """A ``pythonpath`` entry of ``.`` would let a bare ``import gate`` pass in the tests while
    it fails for every user of the wheel: the tests import the installed package."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    paths = pyproject["tool"]["pytest"]["ini_options"].get("pythonpath", [])
    assert not {".", "./", str(REPO)} & set(paths if isinstance(paths, list) else [paths])


def test_no_import_circle(graph: ProjectGraph) -> None:
    """Among the packages' modules, lazy imports and ``from package import submodule`` too."""
    circles = graph.circles(PACKAGES, typing_too=True)
    culprits = "\n".join(
        " <-> ".join(c) + "".join(f"\n    {i}" for i in graph.circle_imports(c, typing_too=True))
        for c in circles
    )
    assert not circles, f"{len(circles)} import circle(s):\n{culprits}"


def test_no_import_up_the_layers(graph: ProjectGraph) -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for module in graph.paths:
        source = graph.top(module)
        if source not in PACKAGES:
            continue
        for imp in graph.project_imports(module, typing_too=True):
            target = graph.top(imp.target)
            if target == source or target not in PACKAGES:
                continue
            if source in STANDALONE or target in STANDALONE or rank[target] > rank[source]:
                upward.append(str(imp))
    layers = " < ".join(LAYERS)
    assert not upward, f"imports up the layers ({layers}; {STANDALONE} standalone):\n" + (
        "\n".join(upward)
    )


def test_the_simulator_imports_neither_deployment_nor_k8s(graph: ProjectGraph) -> None:
    """The layers say so already; said here by name, since it is why ``routing`` and
    ``nccl_log`` exist: the simulator runs the routing policies and reads the nccl-tests log
    without the Serve deployment or the operators' tools."""
    found = [
        str(imp)
        for module in graph.paths
        if graph.top(module) == "sim"
        for imp in graph.project_imports(module, typing_too=True)
        if graph.top(imp.target) in ("deployment", "k8s")
    ]
    assert not found, "the simulator imports:\n" + "\n".join(found)


def test_nothing_imports_the_benchmarks(graph: ProjectGraph) -> None:
    """Benchmarks are scripts: no project module or test imports one, and a benchmark imports
    no other benchmark but their one shared module, ``benchmarks/common.py``, and its own parts
    (``benchmarks/<name>_<part>.py`` beside ``benchmarks/<name>.py``)."""
    found = []
    for module in graph.paths:
        for imp in graph.project_imports(module, typing_too=True):
            if graph.top(imp.target) != "benchmarks":
                continue
            own_part = imp.target.startswith(f"{module}_")
            if graph.top(module) != "benchmarks" or not (
                imp.target == "benchmarks.common" or own_part
            ):
                found.append(str(imp))
    assert not found, "imports of benchmarks:\n" + "\n".join(found)


def test_every_package_is_installed() -> None:
    """``setup.py`` maps every source package into the namespace (an image built from it runs
    them), and no other folder: benchmarks and tests stay out of the wheel."""
    assert set(subpackages()) == set(PACKAGES) - {"roundgate"}


def test_the_control_plane_closure_reaches_no_torch_ray_numpy(graph: ProjectGraph) -> None:
    """Everything ``roundgate.actors.control`` imports, lazily or not, transitively (package
    ``__init__`` modules on the way included): none of it imports a heavy library."""
    control = "roundgate.actors.control"
    starts = [m for m in graph.paths if m == control or m.startswith(f"{control}.")]
    came_from = graph.closure(starts)
    heavy = [
        f"{imp}  via  {' -> '.join(graph.chain(came_from, module))}"
        for module in sorted(came_from)
        for imp in graph.imports[module]
        if imp.target in HEAVY and not imp.is_typing_only
    ]
    assert not heavy, "the control plane's imports reach:\n" + "\n".join(heavy)


def test_no_module_shadows_the_standard_library(graph: ProjectGraph) -> None:
    shadowing = sorted(
        str(path.relative_to(REPO))
        for name, path in graph.paths.items()
        if name.rpartition(".")[2] in sys.stdlib_module_names
    )
    assert not shadowing, f"modules named like a standard library module: {shadowing}"


# --- classes --------------------------------------------------------------------------------


def test_no_class_has_two_project_bases(graph: ProjectGraph) -> None:
    """One class, one file: a class is not assembled from several of the project's classes
    (mixins); it composes the parts it owns."""
    classes = Classes(graph)
    mixed = [
        f"{graph.paths[module].relative_to(REPO)}:{node.lineno} {node.name}"
        f"({', '.join(b[1] for b in bases)})"
        for module, node in classes.every()
        if len(bases := classes.project_bases(module, node)) > 1
    ]
    assert not mixed, "classes with more than one base class of this project:\n" + (
        "\n".join(mixed)
    )


def test_no_annotation_stands_in_for_another_class_state(graph: ProjectGraph) -> None:
    """A class-level annotation without a value declares a field in a dataclass, NamedTuple,
    Protocol, TypedDict, Enum or pydantic model; in any other class it must name an attribute
    that the class (or one of its project ancestors) sets, else it is a stub for state that
    some other class owns (a mixin reading its host's attributes)."""
    classes = Classes(graph)
    stubs = []
    for module, node in classes.every():
        declared = annotation_only(node)
        if not declared or classes.is_record(module, node):
            continue
        assigned = classes.assigned(module, node)
        stubs += [
            f"{graph.paths[module].relative_to(REPO)}:{s.lineno} {node.name}.{s.target.id}"
            for s in declared
            if isinstance(s.target, ast.Name) and s.target.id not in assigned
        ]
    assert not stubs, "annotations for state this class never sets:\n" + "\n".join(stubs)


def _gate_classes(graph: ProjectGraph) -> set[tuple[str, str]]:
    """Every class the gate defines (the policies, their bases and the policy interface)."""
    return {
        (module, node.name)
        for module, tree in graph.trees.items()
        if graph.top(module) == "gate"
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def test_no_isinstance_on_the_gates_classes_outside_the_gate(graph: ProjectGraph) -> None:
    """A policy says what it does through its interface (``roundgate.gate.policy.PrefillPolicy``),
    so nothing outside ``gate/`` asks which policy it holds: no ``isinstance``/``issubclass``
    against a class of the gate, however imported (a lazy import is matched by its name)."""
    classes = Classes(graph)
    gate = _gate_classes(graph)
    names = {name for _, name in gate}
    found = []
    for module, tree in graph.trees.items():
        if graph.top(module) not in PACKAGES or graph.top(module) == "gate":
            continue
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
            ):
                continue
            kinds = node.args[1]
            for kind in kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]:
                resolved = classes.base(module, kind)
                if resolved in gate or (isinstance(resolved, str) and resolved in names):
                    where = f"{graph.paths[module].relative_to(REPO)}:{node.lineno}"
                    found.append(f"{where} {ast.unparse(node)}")
    assert not found, "isinstance on the gate's classes outside gate/:\n" + "\n".join(found)


# --- registries ------------------------------------------------------------------------------


def _defines_router(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Assign | ast.AnnAssign)
        and any(
            isinstance(t, ast.Name) and t.id == "ROUTER"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
        for node in tree.body
    )


def test_every_router_module_is_registered(graph: ProjectGraph) -> None:
    """A module of ``routing/`` that declares a ``ROUTER`` is one line of the registry, and
    each line of the registry a module that declares one, under a name of its own."""
    declaring = {m for m, tree in graph.trees.items() if _defines_router(tree)}
    assert {graph.top(m) for m in declaring} <= {"routing"}, sorted(declaring)
    registered = set(routers.BUILTIN_MODULES)
    assert declaring == registered, (
        f"not registered: {sorted(declaring - registered)}; "
        f"registered without a ROUTER: {sorted(registered - declaring)}"
    )
    names = [e.name for e in routers.entries()]
    assert len(names) == len(set(names)) == len(registered)


def test_every_serve_request_router_is_named_by_a_router(graph: ProjectGraph) -> None:
    """The Serve request router classes the registry names exist, and every public class of
    their modules is named by some router (no class Serve could run that no name reaches)."""
    classes = Classes(graph)
    named = set(routers.serve_classes().values())
    modules = set()
    for path in named:
        module, _, cls = path.partition(":")
        assert (module, cls) in classes.defs, f"{path}: no such class"
        modules.add(module)
    public = {
        f"{module}:{node.name}"
        for module in modules
        for node in graph.trees[module].body
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
    }
    assert public == named, f"request routers no router names: {sorted(public - named)}"
