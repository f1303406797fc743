"""One MoE layer's routing table: logical expert ids from the router -> physical slots.

The router picks logical experts; dispatch moves tokens to physical slots. A logical expert
with several copies sends each token to the copy a multiplicative hash of (its position in
its sequence, the rank it runs on) picks: a function of the token alone, never of the batch
around it, so the choice is deterministic and batch-invariant. Hashed rather than
``position % copies`` because a decode batch's positions all advance together: requests
whose positions share a parity would all pick the same copy in the same round, evening out
only over the window while each round waits on one rank. Hashed, a round's tokens spread over
the copies, which is what the placement algorithm assumes when it splits an expert's load.

Tensor ops only (a gather from a small table), so the forward reads nothing back to the host.
With one copy per expert and slot ``e`` holding expert ``e`` (the static layout) the ids pass
through untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from roundgate.kernels.moe.eplb import Placement, copies_of
from roundgate.kernels.moe.placement import ExpertPlacement


class ExpertMap:
    """``physical_to_logical`` of one layer, with its device lookup tables."""

    def __init__(
        self,
        placement: ExpertPlacement,
        physical_to_logical: Sequence[int],
        device: torch.device | str = "cpu",
    ) -> None:
        self.placement = placement
        self.physical_to_logical: Placement = tuple(physical_to_logical)
        if len(self.physical_to_logical) != placement.num_physical_experts:
            raise ValueError(
                f"a layer's placement has {len(self.physical_to_logical)} slots, the group "
                f"{placement.num_physical_experts}"
            )
        copies = copies_of(self.physical_to_logical, placement.num_experts)
        if min(copies) < 1:
            raise ValueError(f"placement leaves expert {copies.index(0)} without a copy")
        self.identity = self.physical_to_logical == tuple(range(placement.num_experts))
        replicas: list[list[int]] = [[] for _ in copies]
        for slot, expert in enumerate(self.physical_to_logical):
            replicas[expert].append(slot)
        width = max(copies)
        # [E, max copies] slot table (short rows padded with their first copy) and copies.
        self.table = torch.tensor(
            [r + [r[0]] * (width - len(r)) for r in replicas], dtype=torch.long, device=device
        )
        self.copies = torch.tensor(copies, dtype=torch.long, device=device)

    @property
    def local_logical(self) -> tuple[int, ...]:
        """The logical expert in each of this rank's slots (what the loader reads)."""
        slots = self.placement.local_experts
        return self.physical_to_logical[slots.start : slots.stop]

    def to_physical(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The slot each ``[T, k]`` logical choice goes to (``positions``: ``[T]``)."""
        if self.identity:
            return ids
        if positions is None:
            positions = torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
        key = positions.to(torch.long) * _GOLDEN + self.placement.rank * _RANK_MIX
        spread = (key >> 15) & 0xFFFF  # the well-mixed middle bits
        pick = spread.unsqueeze(1) % self.copies[ids]
        return self.table[ids, pick]


# Knuth's multiplicative hash constant and a second odd constant for the rank (positions stay
# below 2**31, so the products fit in int64).
_GOLDEN = 2654435761
_RANK_MIX = 0x85EBCA6B
