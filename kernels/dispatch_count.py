"""Count what a piece of host code dispatches: torch ops, Triton launches and host reads.

A decode round on a GPU is host-bound when the host issues more work than the device does in
the same time: every torch op goes through the dispatcher (microseconds each, views included),
every Triton launch costs a launch, and every read of a device value back to the host
(``item``, ``tolist``, ``int(t)``, ``bool(t)``) waits for the device to drain. This counts the
three on any device, so a CPU test can hold the fused path to a budget that a GPU run would
feel as host time:

    with DispatchCount(layers=model.layers) as count:
        runner.execute(plan)
    count.ops_per_layer()   # torch ops + launches inside each decoder layer
    count.host_reads        # Counter of "item file.py:line" call sites

Torch ops are counted with a ``TorchDispatchMode`` (every op that reaches the dispatcher,
after autograd: what the host pays for). Triton launches are counted at ``run`` of the kernel
object, compiled or interpreted; under Triton's interpreter (CPU) the kernel body itself
calls torch and numpy, and those calls are not counted: on a GPU they are one launch.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# The Tensor methods that read device values back to the host.
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
OUTSIDE = "outside"


@dataclass
class DispatchTally:
    """What one counted region dispatched, attributed to the innermost counted layer."""

    ops: Counter[str] = field(default_factory=Counter)  # layer (or OUTSIDE) -> torch ops
    launches: Counter[str] = field(default_factory=Counter)  # layer (or OUTSIDE) -> launches
    kernels: Counter[str] = field(default_factory=Counter)  # kernel name -> launches
    op_names: Counter[str] = field(default_factory=Counter)  # aten op -> count
    host_reads: Counter[str] = field(default_factory=Counter)  # "method file:line" -> count
    layer_reads: Counter[str] = field(default_factory=Counter)  # layer (or OUTSIDE) -> reads

    def layer_ops(self) -> dict[str, int]:
        """Torch ops plus kernel launches inside each counted layer."""
        names = (set(self.ops) | set(self.launches)) - {OUTSIDE}
        return {name: self.ops[name] + self.launches[name] for name in sorted(names)}

    def ops_per_layer(self) -> float:
        """The mean of ``layer_ops`` over the counted layers (0 when none ran)."""
        per = self.layer_ops()
        return sum(per.values()) / len(per) if per else 0.0

    @property
    def outside_ops(self) -> int:
        """Ops and launches outside every counted layer (embedding, head, sampling, inputs)."""
        return self.ops[OUTSIDE] + self.launches[OUTSIDE]

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values()) + sum(self.launches.values())

    @property
    def num_host_reads(self) -> int:
        return sum(self.host_reads.values())


class _OpMode(TorchDispatchMode):
    def __init__(self, on_op: Callable[[str], None]) -> None:
        super().__init__()
        self.on_op = on_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.on_op(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class DispatchCount:
    """A context manager counting ops, launches and host reads (see the module docstring).

    ``layers``: modules whose forward calls are attributed by name (``layer0``, ...); the
    innermost running one takes each op. Not reentrant, not thread-safe: count one thread.
    """

    def __init__(self, layers: Sequence[nn.Module] = ()) -> None:
        self.tally = DispatchTally()
        self._layers = list(layers)
        self._stack: list[str] = []
        self._in_kernel = 0
        self._exit: ExitStack | None = None

    def __enter__(self) -> DispatchTally:
        stack = ExitStack()
        for index, layer in enumerate(self._layers):
            stack.enter_context(self._attribute(layer, f"layer{index}"))
        for name in HOST_READS:
            stack.enter_context(self._patched_read(name))
        for cls in _kernel_classes():
            stack.enter_context(self._patched_launch(cls))
        stack.enter_context(_OpMode(self._on_op))
        self._exit = stack
        return self.tally

    def __exit__(self, *exc: object) -> None:
        assert self._exit is not None
        self._exit.close()
        self._exit = None

    def _where(self) -> str:
        return self._stack[-1] if self._stack else OUTSIDE

    def _on_op(self, name: str) -> None:
        if not self._in_kernel:
            self.tally.ops[self._where()] += 1
            self.tally.op_names[name] += 1

    @contextmanager
    def _attribute(self, layer: nn.Module, name: str) -> Iterator[None]:
        def before(module: nn.Module, args: Any) -> None:
            self._stack.append(name)

        def after(module: nn.Module, args: Any, out: Any) -> None:
            self._stack.pop()

        hooks = (layer.register_forward_pre_hook(before), layer.register_forward_hook(after))
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    @contextmanager
    def _patched_read(self, method: str) -> Iterator[None]:
        original = getattr(torch.Tensor, method)
        count = self

        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not count._in_kernel:
                frame = traceback.extract_stack(limit=2)[0]
                site = f"{method} {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
                count.tally.host_reads[site] += 1
                count.tally.layer_reads[count._where()] += 1
            return original(tensor, *args, **kwargs)

        setattr(torch.Tensor, method, read)
        try:
            yield
        finally:
            setattr(torch.Tensor, method, original)

    @contextmanager
    def _patched_launch(self, cls: type) -> Iterator[None]:
        original = cls.run
        count = self

        def run(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            if not count._in_kernel:
                count.tally.launches[count._where()] += 1
                fn = getattr(kernel, "fn", kernel)
                count.tally.kernels[getattr(fn, "__name__", repr(fn))] += 1
            count._in_kernel += 1
            try:
                return original(kernel, *args, **kwargs)
            finally:
                count._in_kernel -= 1

        cls.run = run
        try:
            yield
        finally:
            cls.run = original


def _kernel_classes() -> list[type]:
    """Triton's kernel objects whose ``run`` is one launch (none when triton is absent)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        return []
    return [InterpretedFunction, JITFunction]


def count_decode_round(runner: Any, drive: Callable[[], object], batch_size: int) -> DispatchTally:
    """Count the first round ``drive()`` runs through ``runner.execute`` that decodes exactly
    ``batch_size`` requests and extends none (a steady decode round), per decoder layer of
    ``runner.model``; ``ValueError`` when ``drive`` ran no such round."""
    original = runner.execute
    counted: list[DispatchTally] = []

    def execute(plan: Any, *args: Any, **kwargs: Any) -> Any:
        chunks = plan.chunks
        steady = len(chunks) == batch_size and not any(c.is_prefill for c in chunks)
        if counted or not steady:
            return original(plan, *args, **kwargs)
        with DispatchCount(runner.model.layers) as tally:
            result = original(plan, *args, **kwargs)
        counted.append(tally)
        return result

    runner.execute = execute
    try:
        drive()
    finally:
        del runner.execute  # the class's method again
    if not counted:
        raise ValueError(f"no round decoded exactly {batch_size} requests without extending")
    return counted[0]
