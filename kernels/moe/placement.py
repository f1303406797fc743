"""Which rank holds which physical expert slot: contiguous blocks, the layout DeepEP assumes.

A group of ``world_size`` ranks holds ``num_experts + num_redundant_experts`` physical expert
slots, ``n`` per rank: rank ``r`` holds slots ``[r * n, (r + 1) * n)``. Which *logical*
expert each slot holds is a per-layer placement (``kernels/moe/eplb.py``, routed by
``kernels/moe/expert_map.py``); the dispatch/combine backends see slot ids only, so they
move tokens the same way whatever the placement.
"""

from __future__ import annotations

from dataclasses import dataclass

from roundgate.kernels.moe.eplb import Layout


@dataclass(frozen=True)
class ExpertPlacement:
    """The slot geometry of one rank in an expert-parallel group.

    Without redundant experts, slot ``e`` holds logical expert ``e`` until a rebalance moves
    it. Example: 4 experts over 2 ranks -> rank 0 has slots 0, 1 and rank 1 has 2, 3; with 2
    redundant experts each rank has 3 slots.
    """

    num_experts: int  # logical, the model's
    world_size: int = 1
    rank: int = 0
    num_redundant_experts: int = 0

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"expert placement: rank {self.rank} of world {self.world_size}")
        if self.num_experts < 1:
            raise ValueError(f"expert placement: {self.num_experts} experts")
        if self.num_redundant_experts < 0:
            raise ValueError(
                f"--num-redundant-experts must be >= 0, got {self.num_redundant_experts}"
            )
        if self.num_physical_experts % self.world_size:
            if self.num_redundant_experts:
                raise ValueError(
                    f"expert parallelism needs num_experts ({self.num_experts}) + "
                    f"--num-redundant-experts ({self.num_redundant_experts}) divisible by "
                    f"--dp-size ({self.world_size})"
                )
            raise ValueError(
                f"expert parallelism needs num_experts ({self.num_experts}) divisible by "
                f"--dp-size ({self.world_size})"
            )

    @property
    def num_physical_experts(self) -> int:
        return self.num_experts + self.num_redundant_experts

    @property
    def num_local_experts(self) -> int:
        """Physical slots on each rank."""
        return self.num_physical_experts // self.world_size

    @property
    def first_local_expert(self) -> int:
        """This rank's first slot id."""
        return self.rank * self.num_local_experts

    @property
    def local_experts(self) -> range:
        """This rank's slot ids."""
        start = self.first_local_expert
        return range(start, start + self.num_local_experts)

    def owner_of(self, slot: int) -> int:
        """The rank holding physical slot ``slot``."""
        return slot // self.num_local_experts

    def layout(self, num_nodes: int = 1, num_groups: int = 1) -> Layout:
        """The shape the placement algorithm works on."""
        return Layout(
            self.num_experts, self.num_physical_experts, self.world_size, num_nodes, num_groups
        )
