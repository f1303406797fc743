"""The attention backends by name (``--attention-backend``): one line per backend, and the
choice among them.

Adding a backend is its own module plus one line in ``BACKENDS`` (and one in
``LATENT_BACKENDS`` if it has an MLA kernel; in ``CUDA_PREFERENCE`` if ``auto`` may pick it).
The lines name their code by string (``kernels/entry.py``): ``names()``, which ``ServerArgs``
and the CLIs read in every process, imports neither torch nor a GPU library; ``build`` imports
the chosen backend's module only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roundgate.kernels.entry import Available, KernelEntry, device_kind, is_importable, lookup

if TYPE_CHECKING:
    from roundgate.kernels.attention.base import AttentionBackend

FLAG = "--attention-backend"
AUTO = "auto"
_HERE = "roundgate.kernels.attention"

# Paged GQA attention, in the order the choices are listed.
BACKENDS = (
    KernelEntry("torch", f"{_HERE}.torch_ref:TorchAttention"),
    KernelEntry(
        "triton", f"{_HERE}.triton_backend:TritonAttention", runs_on="triton", package="triton"
    ),
    KernelEntry(
        "flashinfer",
        f"{_HERE}.flashinfer_backend:FlashInferAttention",
        args=("num_heads", "num_kv_heads", "head_dim", "dtype", "device"),
        runs_on="cuda",
        package="flashinfer",
    ),
)
# Latent (MLA) attention: the backends that have a kernel for it.
LATENT_BACKENDS = (
    KernelEntry("torch", f"{_HERE}.mla_torch:TorchMLAAttention"),
    KernelEntry(
        "triton", f"{_HERE}.triton_backend:TritonMLAAttention", runs_on="triton", package="triton"
    ),
)
# ``auto`` on CUDA: the first of these that can run, else the reference (on CPU ``auto`` is the
# reference: Triton runs there only under its interpreter, for tests).
CUDA_PREFERENCE = ("flashinfer", "triton")
# The same for latent attention: the Triton MLA kernel (absorbed decode, expanded extend).
# FlashInfer's MLA wrapper is not wrapped here yet; ``benchmarks/gpu_check.sh`` runs this one.
LATENT_CUDA_PREFERENCE = ("triton",)
REFERENCE = "torch"


def names() -> tuple[str, ...]:
    """The ``--attention-backend`` choices."""
    return (AUTO, *(entry.name for entry in BACKENDS))


def get(name: str) -> KernelEntry:
    """The GQA backend ``name`` (not ``auto``); else an error naming the flag."""
    return lookup(BACKENDS, name, FLAG, names())


def resolve(name: str, device: Any, available: Available = is_importable) -> str:
    """The backend ``--attention-backend name`` means on ``device``.

    ``auto`` is ``torch`` on CPU and the first of ``CUDA_PREFERENCE`` that can run on CUDA.
    An explicit backend the device or the installed packages cannot run is a ``ValueError``
    naming the flag rather than a silent fallback (``triton`` runs on a CPU only under
    Triton's interpreter, ``TRITON_INTERPRET=1``, for tests).
    """
    kind = device_kind(device)
    if name == AUTO:
        if kind != "cuda":
            return REFERENCE
        runnable = (n for n in CUDA_PREFERENCE if get(n).can_run(kind, available))
        return next(runnable, REFERENCE)
    get(name).check(FLAG, kind, available)
    return name


def build(
    name: str,
    device: Any,
    *,
    num_heads: int = 0,
    num_kv_heads: int = 0,
    head_dim: int = 0,
    dtype: Any = None,
) -> AttentionBackend:
    """The GQA backend ``resolve`` picks, built (the shape: for the backends that take it)."""
    shape = {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
    return get(resolve(name, device)).build({**shape, "dtype": dtype, "device": device})


def resolve_latent(name: str, device: Any, available: Available = is_importable) -> str:
    """The latent-attention (MLA) backend ``--attention-backend name`` means on ``device``:
    ``auto`` is the first of ``LATENT_CUDA_PREFERENCE`` that can run on CUDA, else the
    reference; a backend without an MLA kernel is refused naming the flag."""
    kind = device_kind(device)
    if name == AUTO:
        if kind != "cuda":
            return REFERENCE
        entries = (lookup(LATENT_BACKENDS, n, FLAG, names()) for n in LATENT_CUDA_PREFERENCE)
        runnable = (e.name for e in entries if e.can_run(kind, available))
        return next(runnable, REFERENCE)
    chosen = resolve(name, device, available)
    latent = [entry.name for entry in LATENT_BACKENDS]
    if chosen not in latent:
        raise ValueError(
            f"{FLAG} {name} has no latent-attention (MLA) kernel here; use {' or '.join(latent)}"
        )
    return chosen


def build_latent(name: str, device: Any, available: Available = is_importable) -> Any:
    """The latent-attention (MLA) backend ``resolve_latent`` picks, built."""
    chosen = resolve_latent(name, device, available)
    return lookup(LATENT_BACKENDS, chosen, FLAG, names()).build({"device": device})
