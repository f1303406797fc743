"""The per-round all-gather over torch.distributed: every rank's packed row in one tensor.

One int64 tensor of ``NUM_COLUMNS`` per rank; the probe booleans are two of those columns,
so the gate costs no collective of its own.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from roundgate.actors.control.gather import Packed


class TorchGather:
    """All-gather of packed rows over a process group (gloo on CPU, NCCL on GPU)."""

    def __init__(self, group: dist.ProcessGroup | None = None, device: str = "cpu") -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.device = torch.device(device)
        self._out: list[torch.Tensor] | None = None

    def all_gather(self, row: Packed) -> list[Packed]:
        mine = torch.tensor(row, dtype=torch.int64, device=self.device)
        if self._out is None or self._out[0].numel() != mine.numel():
            self._out = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(self._out, mine, group=self.group)
        return [tuple(t.tolist()) for t in self._out]
