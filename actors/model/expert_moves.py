"""Moving expert weights between the ranks of a group when a placement changes.

Every rank computes the same ``move_plan`` (``kernels/moe/eplb.py``), so every rank knows,
without asking, what it sends, to whom, and what arrives in which slot: one
``all_to_all_single`` per layer carries the rows (each a slot's ``w13`` and ``w2``
flattened), with splits known in advance. Copies within a rank read from a snapshot taken
before any slot is overwritten, so a plan that rotates experts among slots stays correct.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from roundgate.kernels.moe.eplb import Move


def apply_moves(
    tensors: Sequence[torch.Tensor],
    moves: Sequence[Move],
    rank: int,
    world_size: int,
    group: Any = None,
    into: Sequence[torch.Tensor] | None = None,
) -> int:
    """Copy the planned slots of one layer into this rank's ``tensors`` (each ``[slots, ...]``:
    ``w13``, ``w2``), or into ``into`` (same shapes but the slot count: a re-formed group's
    new tensors, the moves' sources read from ``tensors``); returns the rows this rank
    received from other ranks.

    Every rank of the group calls this with the same ``moves`` (collectives must match); a
    layer where no expert changes rank runs no collective at all, on every rank alike.
    """
    targets = tensors if into is None else into
    remote = [m for m in moves if m.src_rank != m.dst_rank]
    local = [m for m in moves if m.src_rank == m.dst_rank == rank]
    sizes = [math.prod(t.shape[1:]) for t in tensors]
    # Read every source first: a later write may land in a slot an earlier move reads.
    sent = sorted((m for m in remote if m.src_rank == rank), key=lambda m: (m.dst_rank, m.dst_slot))
    send_rows = _rows(tensors, [m.src_slot for m in sent])
    local_rows = _rows(tensors, [m.src_slot for m in local])
    received = 0
    if remote:
        recv = sorted(
            (m for m in remote if m.dst_rank == rank), key=lambda m: (m.src_rank, m.dst_slot)
        )
        send_splits = [sum(m.dst_rank == r for m in sent) for r in range(world_size)]
        recv_splits = [sum(m.src_rank == r for m in recv) for r in range(world_size)]
        recv_rows = send_rows.new_empty(len(recv), sum(sizes))
        dist.all_to_all_single(recv_rows, send_rows, recv_splits, send_splits, group=group)
        _write(targets, [m.dst_slot for m in recv], recv_rows, sizes)
        received = len(recv)
    _write(targets, [m.dst_slot for m in local], local_rows, sizes)
    return received


def _rows(tensors: Sequence[torch.Tensor], slots: list[int]) -> torch.Tensor:
    """``[len(slots), sum of a slot's elements]``: the slots' tensors flattened side by side."""
    index = torch.tensor(slots, dtype=torch.long, device=tensors[0].device)
    parts = [t.index_select(0, index).reshape(len(slots), math.prod(t.shape[1:])) for t in tensors]
    return torch.cat(parts, dim=1).contiguous()


def _write(
    tensors: Sequence[torch.Tensor], slots: list[int], rows: torch.Tensor, sizes: list[int]
) -> None:
    if not slots:
        return
    start = 0
    for tensor, size in zip(tensors, sizes, strict=True):
        part = rows[:, start : start + size].reshape(len(slots), *tensor.shape[1:])
        for i, slot in enumerate(slots):
            tensor[slot].copy_(part[i])
        start += size
