"""What a rank's kernel flags resolve to, all at once: the attention backend (latent for MLA),
the MoE dispatch/combine backend and the expert computation, for a device and the packages
installed. The runner builds each through its registry; this answers the same questions
without building anything (no torch, no GPU), so a test can ask what a shipped GPU config
runs on CUDA from a CPU machine, with the installed packages stood in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roundgate.kernels.attention import registry as attention
from roundgate.kernels.entry import Available, is_importable
from roundgate.kernels.moe import registry as moe


@dataclass(frozen=True)
class KernelChoice:
    """The backends one rank runs (None: the model has no MoE layers)."""

    attention: str  # --attention-backend, resolved (the latent backend for MLA models)
    moe_backend: str | None  # --moe-backend, resolved for the expert-parallel world
    moe_kernel: str | None  # --moe-kernel, resolved


def resolve_kernels(
    attention_backend: str,
    moe_backend: str,
    moe_kernel: str,
    *,
    is_mla: bool,
    is_moe: bool,
    expert_world: int,
    device: Any,
    available: Available = is_importable,
) -> KernelChoice:
    """The choice each flag makes on ``device`` (``ValueError`` naming the flag where one
    cannot run), as the registries' ``build`` functions would make it."""
    if is_mla:
        chosen = attention.resolve_latent(attention_backend, device, available)
    else:
        chosen = attention.resolve(attention_backend, device, available)
    if not is_moe:
        return KernelChoice(chosen, None, None)
    return KernelChoice(
        chosen,
        moe.resolve_backend(moe_backend, expert_world, device, available),
        moe.resolve_kernel(moe_kernel, device, available),
    )
