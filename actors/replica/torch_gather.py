"""The per-round all-gather over torch.distributed: every rank's packed row in one tensor.

One int64 row per rank; the probe booleans are two of its columns, so the gate costs no
collective of its own. The same code runs on gloo (CPU tensors, the tests) and on NCCL (the
rows on the GPU, as the design has NCCL carry them)::

    row (host ints) --pack_rows--> [1, W] --H2D--> all_gather_single --> [world, W]
        --unpack_rows: one .tolist()--> rows (host ints)

so a round costs one asynchronous host-to-device copy (from pinned memory), one collective and
one device read, its only sync, whatever the group's size (the list form read each rank's
tensor back on its own: ``world`` reads, each a sync on a GPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from roundgate.actors.control.gather import Packed


def pack_rows(rows: Sequence[Packed]) -> torch.Tensor:
    """Rows of one width as a ``[len(rows), width]`` int64 host tensor (the gather's wire form).

    >>> pack_rows([(1, 2, 3)]).shape
    torch.Size([1, 3])
    """
    widths = sorted({len(row) for row in rows})
    if not rows or widths[0] == 0:
        raise ValueError(f"pack_rows needs at least one non-empty row, got {list(rows)}")
    if len(widths) > 1:
        raise ValueError(f"rows of a gather share one width, got widths {widths}")
    return torch.tensor(rows, dtype=torch.int64)


def unpack_rows(gathered: torch.Tensor) -> list[Packed]:
    """The gathered ``[world, width]`` tensor as rows of host ints, in one read of the device.

    The single ``tolist`` is the round's only device-to-host copy (and its only sync on a GPU).
    """
    if gathered.dim() != 2 or gathered.dtype != torch.int64:
        raise ValueError(
            f"unpack_rows needs a [world, width] int64 tensor, got {gathered.dtype} "
            f"of shape {tuple(gathered.shape)}"
        )
    return [tuple(row) for row in gathered.tolist()]


class TorchGather:
    """All-gather of packed rows over a process group (gloo on CPU, NCCL on GPU)."""

    def __init__(self, group: dist.ProcessGroup | None = None, device: str = "cpu") -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.device = torch.device(device)
        # The gathered rows' buffer on ``device``, kept while the width stays (a policy's
        # extra columns fix it for a run; the elastic gather adds one flag column).
        self._out: torch.Tensor | None = None

    def all_gather(self, row: Packed) -> list[Packed]:
        mine = pack_rows([row])
        if self.device.type != "cpu":
            # From pinned memory, asynchronously: a blocking H2D copy would wait for the
            # stream (a forward in flight); the gathered rows' read is the round's one sync.
            mine = mine.pin_memory().to(self.device, non_blocking=True)
        width = mine.shape[1]
        if self._out is None or self._out.shape[1] != width:
            self._out = torch.empty((self.world_size, width), dtype=torch.int64, device=self.device)
        dist.all_gather_single(self._out, mine, group=self.group)
        return unpack_rows(self._out)
