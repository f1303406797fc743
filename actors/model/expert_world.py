"""A rank's expert-parallel world: the process group's size and rank, checked against the
flags, and the rank's expert placement from ``--expert-placement-file``."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from roundgate.actors.model.runner_config import RunnerConfig
from roundgate.kernels.moe.eplb import Placement
from roundgate.kernels.moe.placement import ExpertPlacement
from roundgate.kernels.moe.placement_file import read_placement_file


def placement_file(config: RunnerConfig, placement: ExpertPlacement) -> list[Placement] | None:
    """``--expert-placement-file``'s placements (checked again: this rank's file)."""
    path = config.expert_placement_file
    if path is None or placement.world_size == 1:
        return None
    model = config.model_config
    moe_layers = sum(model.is_moe_layer(i) for i in range(model.num_layers))
    return read_placement_file(path, placement.layout(), moe_layers)


def group_world(dp_size: int, rank: int, group: Any) -> int:
    """The expert-parallel world: ``dp_size``, checked against the process group."""
    if dp_size == 1:
        return 1
    if not dist.is_initialized():
        raise ValueError(
            f"--dp-size {dp_size} with an MoE model needs torch.distributed initialised "
            "(the DP group's process group)"
        )
    world, group_rank = dist.get_world_size(group), dist.get_rank(group)
    if world != dp_size or group_rank != rank:
        raise ValueError(
            f"process group has rank {group_rank} of {world}, but the runner was built as "
            f"rank {rank} of --dp-size {dp_size}"
        )
    return world
