"""The dispatch/combine contract shared by every MoE backend, and the local expert compute.

One MoE layer on one rank::

    d = backend.dispatch(x, topk_ids, topk_weights, low_latency=...)  # rows for MY experts
    y = run_experts(d.hidden, d.counts, w13, w2)                     # unweighted outputs
    out = backend.combine(y, d)                                      # weighted sum, [T, H]

``dispatch`` returns the (token, expert) pairs routed to this rank's experts, grouped by
local expert (``counts[e]`` rows for local expert ``e``, in order). Expert outputs come
back *unweighted*; ``combine`` applies the router weights wherever the backend's wire
format wants them (DeepEP low-latency weights inside its combine kernel). Every rank calls
both for every MoE layer, even with zero tokens, because the collectives must match.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from roundgate.kernels.moe.placement import ExpertPlacement


@dataclass
class Dispatched:
    """Rows this rank's experts must compute, grouped by local expert."""

    hidden: torch.Tensor  # [N, H]; [E_local, M, H] when ``device_counts`` is set
    counts: list[int]  # rows per local expert, len == num_local_experts, sum == N
    handle: Any  # backend-private state for combine
    # The masked layout (``MoEBackend.take_masked_experts``): ``hidden[e, :device_counts[e]]``
    # are local expert ``e``'s rows, the counts never read to the host (``counts`` empty).
    device_counts: torch.Tensor | None = None


class MoEBackend(Protocol):
    """Moves tokens to the ranks that hold their experts and back."""

    name: str
    placement: ExpertPlacement

    @property
    def needs_collectives(self) -> bool:
        """Whether an idle rank must still run the layer (to join the group's collectives)."""
        ...

    @property
    def is_graph_safe(self) -> bool:
        """Whether the low-latency legs can run inside a captured decode graph: no host read
        (counts stay on the device), shapes fixed by the batch size, nothing decided in Python
        per round. A backend that reads counts back (``tolist``) is not; default ``False``."""
        return False

    def take_masked_experts(self) -> bool:
        """Offer the low-latency legs the experts over a masked layout (``masked_experts``:
        rows packed per expert, the counts on the device). A backend that accepts returns
        ``True`` and from then on dispatches that layout on its low-latency legs, which can
        then be captured (``is_graph_safe``); default: declines."""
        return False

    def dispatch(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        low_latency: bool,
    ) -> Dispatched: ...

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor: ...


def group_by_expert(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """``(order, counts)``: a stable permutation grouping ``expert_ids`` ascending."""
    order = torch.argsort(expert_ids, stable=True)
    counts = torch.bincount(expert_ids, minlength=num_experts).tolist()
    return order, counts


# ``run_experts``' signature, which every ``--moe-kernel`` has: grouped rows, rows per local
# expert, w13, w2 -> unweighted rows.
ExpertsKernel = Callable[[torch.Tensor, list[int], torch.Tensor, torch.Tensor], torch.Tensor]


def run_experts(
    hidden: torch.Tensor, counts: list[int], w13: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    """SwiGLU experts over grouped rows: ``w13: [E, 2I, H]`` (gate then up), ``w2: [E, H, I]``.

    One GEMM pair per expert with rows; experts without rows cost nothing.
    """
    out = torch.empty_like(hidden)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = hidden[start : start + count]
        gate, up = F.linear(rows, w13[expert]).chunk(2, dim=-1)
        out[start : start + count] = F.linear(F.silu(gate) * up, w2[expert])
        start += count
    return out
