"""Which rank holds which expert: contiguous blocks, the layout DeepEP assumes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExpertPlacement:
    """``num_experts`` experts split over ``world_size`` ranks in contiguous blocks.

    Rank ``r`` owns experts ``[r * n, (r + 1) * n)`` with ``n = num_experts // world_size``;
    expert ``e`` lives on rank ``e // n`` as local expert ``e % n``. Contiguous blocks (not
    round-robin) because DeepEP numbers local experts that way, so every backend agrees on
    one layout. Example: 4 experts over 2 ranks -> rank 0 has 0, 1 and rank 1 has 2, 3.
    """

    num_experts: int
    world_size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"expert placement: rank {self.rank} of world {self.world_size}")
        if self.num_experts < 1 or self.num_experts % self.world_size:
            raise ValueError(
                f"expert parallelism needs num_experts ({self.num_experts}) divisible by "
                f"--dp-size ({self.world_size})"
            )

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.world_size

    @property
    def first_local_expert(self) -> int:
        return self.rank * self.num_local_experts

    @property
    def local_experts(self) -> range:
        """Global ids of this rank's experts."""
        start = self.first_local_expert
        return range(start, start + self.num_local_experts)

    def owner_of(self, expert: int) -> int:
        """The rank holding global expert ``expert``."""
        return expert // self.num_local_experts
