"""Carrying out a re-home: a re-formed MoE group's experts onto its members.

Called by every member of a new membership epoch, on its engine thread, before the epoch's
first round (``ModelRunner.regroup_experts``). The members gather what each holds (one
``all_gather_object`` of the logical expert in every slot, per MoE layer), every member runs
the same pure plan (``kernels/moe/rehome.py``), and then per layer: the slots' new tensors
are allocated at the new layout's size, filled from the members' old slots over the new
group (``expert_moves.apply_moves``, one all-to-all per layer that needs one) and, for an
expert no member holds, read from the model's files by the member that gets it; the layer
swaps in the new tensors and routing table.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from roundgate.actors.model.expert_moves import apply_moves
from roundgate.actors.model.moe import SparseMoE
from roundgate.actors.model.weights import TensorSource
from roundgate.kernels.moe.expert_map import ExpertMap
from roundgate.kernels.moe.placement import ExpertPlacement
from roundgate.kernels.moe.rehome import rehome_layer


@dataclass(frozen=True)
class RehomeReport:
    """One re-home, as ``/metrics`` shows it (identical on every member but ``seconds``)."""

    seconds: float
    world_size: int
    experts_transferred: int  # slots, group-wide, filled from another member's copy
    experts_loaded: int  # slots, group-wide, read from the model's files (no copy survived)


@torch.inference_mode()
def rehome_experts(
    model: Any,  # CausalLM: its ``layers`` and ``moe_layers()``
    placement: ExpertPlacement,
    group: Any,
    source: Any,  # () -> TensorSource: opened only when some slot must be read from files
    loads: Sequence[Sequence[float]] | None = None,
    first_layer: int = 0,
) -> RehomeReport:
    """Re-home every MoE layer of ``model`` onto ``placement`` (this member's place in the new
    group); ``loads``: per MoE layer, per logical expert, to balance on (uniform when None);
    ``first_layer``: the checkpoint's index of ``model.layers[0]`` (a next-n layer's is
    ``num_layers``)."""
    started = time.perf_counter()
    layers = [(first_layer + i, layer.mlp) for i, layer in enumerate(model.layers)]
    moes: list[tuple[int, SparseMoE]] = [(i, m) for i, m in layers if isinstance(m, SparseMoE)]
    mine = [tuple(m.expert_map.local_logical) if m.w13.shape[0] else () for _, m in moes]
    world, rank = placement.world_size, placement.rank
    holdings: list[Any] = [mine]
    if world > 1:
        holdings = [None] * world
        dist.all_gather_object(holdings, mine, group=group)
    layout = placement.layout()
    transferred = loaded = 0
    opened: TensorSource | None = None
    for index, (layer_index, moe) in enumerate(moes):
        plan = rehome_layer(
            [h[index] for h in holdings], layout, loads[index] if loads is not None else None
        )
        slots = placement.num_local_experts
        w13 = moe.w13.new_empty((slots, *moe.w13.shape[1:]))
        w2 = moe.w2.new_empty((slots, *moe.w2.shape[1:]))
        apply_moves([moe.w13, moe.w2], plan.moves, rank, world, group, into=[w13, w2])
        moe.w13 = nn.Parameter(w13, requires_grad=False)
        moe.w2 = nn.Parameter(w2, requires_grad=False)
        moe.expert_map = ExpertMap(placement, plan.placement, moe.expert_map.table.device)
        from_files = [d.slot for d in plan.loads if d.rank == rank]
        if from_files:
            opened = opened or source()
            moe.load_experts(opened, f"model.layers.{layer_index}.", from_files)
        transferred += plan.transfers
        loaded += len(plan.loads)
    model.placement = placement
    return RehomeReport(time.perf_counter() - started, world, transferred, loaded)
