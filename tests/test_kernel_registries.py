"""The kernel registries (``kernels/attention/registry.py``, ``kernels/moe/registry.py``): the
names the flags offer, that listing them loads no torch or GPU library, that every line names
code that exists under its own name, and that every backend class is a line."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from import_graph import ProjectGraph

from roundgate.actors.server_args import ServerArgs
from roundgate.kernels.attention import registry as attention
from roundgate.kernels.entry import KernelEntry
from roundgate.kernels.moe import registry as moe
from roundgate.kernels.moe.placement import ExpertPlacement

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "flashinfer", "deep_ep", "numpy")
EVERY_ENTRY = [
    *(("attention", e) for e in attention.BACKENDS),
    *(("latent attention", e) for e in attention.LATENT_BACKENDS),
    *(("moe backend", e) for e in moe.BACKENDS),
]


def _choices(field: str) -> tuple[str, ...]:
    (found,) = [f for f in dataclasses.fields(ServerArgs) if f.name == field]
    return tuple(found.metadata["choices"])


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (attention.names(), ("auto", "torch", "triton", "flashinfer")),
        (moe.backend_names(), ("auto", "local", "torch", "deepep")),
        (moe.kernel_names(), ("auto", "torch", "triton")),
    ],
)
def test_the_registries_list_the_choices(names: tuple[str, ...], expected: tuple[str, ...]):
    assert names == expected


@pytest.mark.parametrize(
    ("field", "names"),
    [
        ("attention_backend", attention.names()),
        ("moe_backend", moe.backend_names()),
        ("moe_kernel", moe.kernel_names()),
    ],
)
def test_server_args_offers_the_registries_names(field: str, names: tuple[str, ...]) -> None:
    """``ServerArgs``' choices (its flags' and the serve config's) are the registries'."""
    assert _choices(field) == names


def test_listing_the_names_imports_no_torch_nor_gpu_library() -> None:
    code = (
        "import sys\n"
        "from roundgate.kernels.attention import registry as a\n"
        "from roundgate.kernels.moe import registry as m\n"
        "a.names(), m.backend_names(), m.kernel_names()\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert not set(out.stdout.split()) & set(HEAVY)


def test_the_registries_closure_reaches_no_heavy_import() -> None:
    """What ``ServerArgs`` would load to list the names, read from the source (lazy imports
    and package ``__init__`` modules included): the backends' code is named by string only."""
    graph = ProjectGraph(REPO, ("kernels",))
    starts = ["roundgate.kernels.attention.registry", "roundgate.kernels.moe.registry"]
    came_from = graph.closure(starts)
    heavy = [
        str(imp)
        for module in came_from
        for imp in graph.imports[module]
        if imp.target in HEAVY and not imp.is_typing_only
    ]
    assert not heavy


@pytest.mark.parametrize(("kind", "entry"), EVERY_ENTRY, ids=lambda x: getattr(x, "name", x))
def test_every_backend_line_names_its_class(kind: str, entry: KernelEntry) -> None:
    """The class exists, answers to the line's name, and takes the line's arguments first."""
    backend = entry.load()
    assert backend.name == entry.name, kind
    params = list(inspect.signature(backend).parameters.values())
    assert tuple(p.name for p in params[: len(entry.args)]) == entry.args
    assert all(p.default is not p.empty for p in params[len(entry.args) :])


@pytest.mark.parametrize("entry", moe.KERNELS, ids=lambda e: e.name)
def test_every_experts_kernel_takes_run_experts_arguments(entry: KernelEntry) -> None:
    params = list(inspect.signature(entry.load()).parameters)
    assert params[:4] == ["hidden", "counts", "w13", "w2"]


def test_the_fp8_experts_kernel_takes_the_scales_beside_the_weights() -> None:
    params = list(inspect.signature(moe.fp8_experts_kernel()).parameters)
    assert params == ["hidden", "counts", "w13", "w13_scale_inv", "w2", "w2_scale_inv"]


@pytest.mark.parametrize(
    ("name", "device", "installed", "expected"),
    [
        ("auto", "cuda", True, "triton"),
        ("auto", "cuda:2", True, "triton"),
        ("auto", "cuda", False, "torch"),
        ("auto", "cpu", True, "torch"),
        ("torch", "cuda", True, "torch"),
        ("triton", "cuda", True, "triton"),
    ],
)
def test_moe_kernel_auto_is_the_fused_kernel_on_cuda(
    name: str, device: str, installed: bool, expected: str
) -> None:
    assert moe.resolve_kernel(name, device, lambda module: installed) == expected


def _backend_classes(folder: str) -> set[str]:
    """``module:Class`` of each class of ``kernels/<folder>`` that declares a ``name``."""
    found = set()
    for path in sorted((REPO / "kernels" / folder).glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and any(
                isinstance(s, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "name" for t in s.targets)
                for s in node.body
            ):
                found.add(f"roundgate.kernels.{folder}.{path.stem}:{node.name}")
    return found


@pytest.mark.parametrize(
    ("folder", "entries"),
    [
        ("attention", (*attention.BACKENDS, *attention.LATENT_BACKENDS)),
        ("moe", moe.BACKENDS),
    ],
)
def test_every_backend_class_is_registered(folder: str, entries: tuple[KernelEntry, ...]):
    """A backend class no line names could never be chosen."""
    assert _backend_classes(folder) == {e.target for e in entries}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: attention.get("auto"), "--attention-backend must be one of auto, torch"),
        (lambda: attention.build("xformers", "cpu"), "--attention-backend must be one of"),
        (lambda: moe.build_backend("nccl", ExpertPlacement(4, 1, 0)), "--moe-backend must be"),
        (lambda: moe.experts_kernel("cutlass", "cpu"), "--moe-kernel must be one of auto, torch"),
        (lambda: attention.build("flashinfer", "cpu"), "--attention-backend flashinfer needs"),
        (lambda: moe.build_backend("deepep", ExpertPlacement(4, 2, 0)), "--moe-backend deepep"),
    ],
)
def test_unknown_or_impossible_choices_name_the_flag(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    ("name", "world_size", "expected"),
    [("auto", 1, "local"), ("local", 1, "local"), ("torch", 1, "local"), ("torch", 2, "torch")],
)
def test_build_backend_builds_the_resolved_choice(name: str, world_size: int, expected: str):
    placement = ExpertPlacement(4, world_size, 0)
    assert moe.build_backend(name, placement).name == expected


def test_a_latent_backend_without_a_kernel_is_refused() -> None:
    def everything(module: str) -> bool:
        return True

    with pytest.raises(ValueError, match=r"flashinfer has no latent-attention .* torch or triton"):
        attention.build_latent("flashinfer", "cuda", everything)
    assert attention.resolve_latent("auto", "cuda", everything) == "triton"
    assert attention.resolve_latent("auto", "cpu", everything) == "torch"
