"""The per-round all-gather of packed ``RankRow`` columns, in-process flavours.

The torch.distributed gather (one int64 tensor, gloo or NCCL) lives with the Ray rank actor;
these two serve a single rank and threads of one process.
"""

from __future__ import annotations

import threading
from typing import Protocol

Packed = tuple[int, ...]


class Gather(Protocol):
    """Every rank contributes its packed row and receives every rank's, in rank order."""

    def all_gather(self, row: Packed) -> list[Packed]: ...


class SingleRankGather:
    """dp=1: the gather of one row is that row."""

    def all_gather(self, row: Packed) -> list[Packed]:
        return [row]


class ThreadGather:
    """A group of ``size`` ranks running as threads of one process.

    Each rank calls ``for_rank(i).all_gather(row)``; the call returns once every rank has
    contributed this round. A barrier ``timeout`` turns a missing rank into an error, not a hang.
    """

    def __init__(self, size: int, timeout: float | None = 30.0) -> None:
        self.size = size
        self._rows: list[Packed | None] = [None] * size
        self._barrier = threading.Barrier(size, timeout=timeout)
        self._done = threading.Barrier(size, timeout=timeout)

    def for_rank(self, rank: int) -> _RankHandle:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} outside a group of {self.size}")
        return _RankHandle(self, rank)

    def _gather(self, rank: int, row: Packed) -> list[Packed]:
        self._rows[rank] = row
        self._barrier.wait()
        rows = [r for r in self._rows if r is not None]
        # Second barrier: nobody overwrites a slot until every rank has read this round.
        self._done.wait()
        return rows


class _RankHandle:
    def __init__(self, group: ThreadGather, rank: int) -> None:
        self._group = group
        self._rank = rank

    def all_gather(self, row: Packed) -> list[Packed]:
        return self._group._gather(self._rank, row)
