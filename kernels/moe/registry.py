"""The MoE choices by name: the dispatch/combine backends (``--moe-backend``) and the expert
computations between them (``--moe-kernel``), one line each, and the choice among them.

Adding one is its own module plus one line in ``BACKENDS`` or ``KERNELS``. The lines name
their code by string (``kernels/entry.py``): ``backend_names()`` and ``kernel_names()``,
which ``ServerArgs`` and the CLIs read in every process, import neither torch nor a GPU
library; ``build_backend`` and ``experts_kernel`` import the chosen module only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roundgate.kernels.entry import Available, KernelEntry, device_kind, is_importable, lookup

if TYPE_CHECKING:
    from roundgate.kernels.moe.base import ExpertsKernel, MoEBackend
    from roundgate.kernels.moe.placement import ExpertPlacement

BACKEND_FLAG = "--moe-backend"
KERNEL_FLAG = "--moe-kernel"
AUTO = "auto"
_HERE = "roundgate.kernels.moe"

# Dispatch/combine, in the order the choices are listed. Each constructor takes a prefix of
# what ``build_backend`` knows (DeepEP sizes its buffers with the rest).
BACKENDS = (
    KernelEntry("local", f"{_HERE}.local:LocalMoE", args=("placement",)),
    KernelEntry("torch", f"{_HERE}.torch_a2a:TorchAllToAllMoE", args=("placement", "group")),
    KernelEntry(
        "deepep",
        f"{_HERE}.deepep:DeepEPMoE",
        args=("placement", "group", "hidden_size", "max_dispatch_tokens_per_rank"),
        runs_on="cuda",
        package="deep_ep",
    ),
)
# One rank has nobody to send tokens to: the local path is the same computation.
SINGLE_RANK = "local"
# ``auto`` on more than one rank: the first of these that can run, else ``torch``.
CUDA_PREFERENCE = ("deepep",)
MULTI_RANK_DEFAULT = "torch"

# The expert computation: functions of ``ExpertsKernel``'s signature, returned as they are.
# ``auto``: the first of ``KERNEL_CUDA_PREFERENCE`` that can run on CUDA, else ``torch``.
KERNEL_CUDA_PREFERENCE = ("triton",)
KERNEL_REFERENCE = "torch"
KERNELS = (
    KernelEntry("torch", f"{_HERE}.base:run_experts"),
    KernelEntry(
        "triton", f"{_HERE}.triton_experts:triton_run_experts", runs_on="triton", package="triton"
    ),
)


# Experts kept FP8 (``--fp8-weights``) on CUDA: ``run_experts``' contract over e4m3 ``w13``/``w2``
# with their 128x128 block scales (``fp8_run_experts(hidden, counts, w13, w13_scale_inv, w2,
# w2_scale_inv)``). Not a ``--moe-kernel`` choice: the weights' format picks it, whatever the
# flag says (the bf16 kernels cannot read e4m3).
FP8_KERNEL = KernelEntry(
    "triton-fp8",
    "roundgate.kernels.quant.triton_fp8_experts:fp8_run_experts",
    runs_on="triton",
    package="triton",
)


def backend_names() -> tuple[str, ...]:
    """The ``--moe-backend`` choices."""
    return (AUTO, *(entry.name for entry in BACKENDS))


def kernel_names() -> tuple[str, ...]:
    """The ``--moe-kernel`` choices."""
    return (AUTO, *(entry.name for entry in KERNELS))


def resolve_kernel(name: str, device: Any, available: Available = is_importable) -> str:
    """The expert computation ``--moe-kernel name`` means on ``device``: ``auto`` is the first
    of ``KERNEL_CUDA_PREFERENCE`` that can run on CUDA (the fused Triton kernels), else
    ``torch`` (on CPU too, where Triton would run only under its interpreter); impossible
    explicit choices are a ``ValueError`` naming the flag."""
    kind = device_kind(device)
    if name == AUTO:
        if kind != "cuda":
            return KERNEL_REFERENCE
        runnable = (n for n in KERNEL_CUDA_PREFERENCE if _kernel(n).can_run(kind, available))
        return next(runnable, KERNEL_REFERENCE)
    _kernel(name).check(KERNEL_FLAG, kind, available)
    return name


def resolve_backend(
    name: str, world_size: int, device: Any, available: Available = is_importable
) -> str:
    """The backend ``--moe-backend name`` means for a group of ``world_size`` on ``device``.

    ``auto``: ``local`` for one rank; else the first of ``CUDA_PREFERENCE`` that can run
    (``deepep`` on CUDA with ``deep_ep`` importable), else ``torch``. ``torch`` on one rank is
    ``local`` (nothing to send). Impossible explicit choices are a ``ValueError`` naming the
    flag.
    """
    kind = device_kind(device)
    if name == AUTO:
        if world_size == 1:
            return SINGLE_RANK
        runnable = (n for n in CUDA_PREFERENCE if _backend(n).can_run(kind, available))
        return next(runnable, MULTI_RANK_DEFAULT)
    entry = _backend(name)
    if name == SINGLE_RANK:
        if world_size != 1:
            raise ValueError(f"{BACKEND_FLAG} {name} needs --dp-size 1, got {world_size}")
        return name
    if name == MULTI_RANK_DEFAULT and world_size == 1:
        return SINGLE_RANK
    entry.check(BACKEND_FLAG, kind, available)
    return name


def build_backend(
    name: str,
    placement: ExpertPlacement,
    *,
    group: Any = None,
    device: Any = "cpu",
    hidden_size: int = 0,
    max_dispatch_tokens_per_rank: int = 0,
) -> MoEBackend:
    """The backend ``resolve_backend`` picks, built (the sizes: for the backends that take
    them)."""
    chosen = resolve_backend(name, placement.world_size, device)
    given = {
        "placement": placement,
        "group": group,
        "hidden_size": hidden_size,
        "max_dispatch_tokens_per_rank": max_dispatch_tokens_per_rank,
    }
    return _backend(chosen).build(given)


def experts_kernel(name: str, device: Any, available: Available = is_importable) -> ExpertsKernel:
    """The expert computation ``--moe-kernel name`` means on ``device`` (``resolve_kernel``):
    ``torch`` (a GEMM pair per expert) or ``triton`` (fused grouped GEMMs; CUDA, or CPU under
    ``TRITON_INTERPRET=1``)."""
    return _kernel(resolve_kernel(name, device, available)).load()


def fp8_experts_kernel() -> Any:
    """``fp8_run_experts`` (imports triton): the experts over FP8 weights on CUDA."""
    return FP8_KERNEL.load()


def _kernel(name: str) -> KernelEntry:
    return lookup(KERNELS, name, KERNEL_FLAG, kernel_names())


def _backend(name: str) -> KernelEntry:
    return lookup(BACKENDS, name, BACKEND_FLAG, backend_names())
