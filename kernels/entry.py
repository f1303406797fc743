"""One choice of a kernel flag (``--attention-backend``, ``--moe-backend``, ``--moe-kernel``):
its name, where its code lives and what it needs to run, readable without importing that code.

The registries (``kernels/attention/registry.py``, ``kernels/moe/registry.py``) are tuples of
these. The code is named by a string and imported only when the choice is built, so listing the
names (``ServerArgs``, the CLIs, in every process) imports neither torch nor a GPU library, and
a device or package the choice lacks is refused naming the flag before any import is tried.
Stdlib only.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from roundgate.kernels.triton_env import check_triton_device

# Where a choice's kernels run: any device, CUDA only, or where Triton runs them (CUDA, or the
# CPU under Triton's interpreter; ``triton_env.check_triton_device``).
RunsOn = Literal["any", "cuda", "triton"]
Available = Callable[[str], bool]


def is_importable(module: str) -> bool:
    """Whether ``module`` could be imported, without importing it."""
    return importlib.util.find_spec(module) is not None


def device_kind(device: Any) -> str:
    """``"cuda"`` for ``torch.device("cuda:1")`` or ``"cuda:1"`` alike, without torch."""
    kind = getattr(device, "type", None)
    return kind if isinstance(kind, str) else str(device).partition(":")[0]


@dataclass(frozen=True)
class KernelEntry:
    """One registered choice; ``target`` is imported only by ``load``/``build``.

    >>> KernelEntry("torch", "roundgate.kernels.moe.base:run_experts").name
    'torch'
    """

    name: str
    target: str  # ``module:attribute``: the backend class (or the kernel function)
    # The build's arguments ``target``'s constructor takes, in its order (the registry's
    # ``build`` passes all it knows; each choice takes what it needs).
    args: tuple[str, ...] = ()
    runs_on: RunsOn = "any"
    package: str | None = None  # the import it needs (an optional extra's), checked unimported

    def check(self, flag: str, kind: str, available: Available = is_importable) -> None:
        """Refuse running on a device of ``kind``, or without the package: ``ValueError``
        naming ``flag``."""
        if self.runs_on == "triton":
            check_triton_device(flag, kind)
        elif self.runs_on == "cuda" and kind != "cuda":
            raise ValueError(f"{flag} {self.name} needs a CUDA device, got {kind}")
        if self.package is not None and not available(self.package):
            raise ValueError(f"{flag} {self.name}: the {self.package!r} package is not installed")

    def can_run(self, kind: str, available: Available = is_importable) -> bool:
        """Whether ``check`` would pass (``auto``'s question)."""
        try:
            self.check("", kind, available)
        except ValueError:
            return False
        return True

    def load(self) -> Any:
        """The target itself (imported now)."""
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def build(self, given: dict[str, Any]) -> Any:
        """The target called with the arguments of ``given`` it takes (``args``)."""
        return self.load()(*(given[name] for name in self.args))


def lookup(
    entries: tuple[KernelEntry, ...], name: str, flag: str, choices: tuple[str, ...]
) -> KernelEntry:
    """The entry called ``name``; else a ``ValueError`` naming ``flag`` and its ``choices``."""
    for entry in entries:
        if entry.name == name:
            return entry
    raise ValueError(f"{flag} must be one of {', '.join(choices)}, got {name!r}")
