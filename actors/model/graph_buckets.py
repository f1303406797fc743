"""Which captured decode batch size (bucket) a round replays, alone or as a group.

A rank alone pads its decodes up to the smallest bucket that holds them. Under attention DP
with MoE collectives inside the graph (DeepEP's low-latency legs), every rank of the group
must replay a graph of the same size in the same round, or their dispatches would not pair
up. The round's gathered rows, which every rank holds identically, fix that size::

    rows (one per rank):  batch 3   batch 0   batch 6   batch 1
    largest batch: 6  ->  group bucket: 8 (smallest bucket >= 6) on all four ranks
    rank 0 pads 3 -> 8, rank 1 replays 8 rows of padding, rank 2 pads 6 -> 8, ...

Pure arithmetic on host ints: no torch, so it is checked on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from roundgate.gate.rows import RankRow

MAX_CAPTURED_BATCH = 256


def capture_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Bucket sizes for a rank of ``max_batch_size`` running requests.

    Example: 20 -> ``(1, 2, 4, 8, 16, 20)``; 3 -> ``(1, 2, 3)``.
    """
    limit = min(max_batch_size, MAX_CAPTURED_BATCH)
    sizes = [s for s in (1, 2, 4) if s < limit] + list(range(8, limit, 8))
    return (*sizes, limit)


def bucket_for(batch_size: int, sizes: Sequence[int]) -> int | None:
    """The smallest bucket holding ``batch_size`` decodes; ``None``: run eagerly."""
    return next((s for s in sizes if s >= batch_size), None) if batch_size > 0 else None


def group_bucket(rows: Sequence[RankRow], sizes: Sequence[int]) -> int | None:
    """The bucket every rank of the group replays this round, or ``None``: all run eagerly.

    Only a round in which every rank's batch is one token a request (no extend, no drafts to
    verify) replays; the bucket is the smallest holding the largest rank's batch. The rows
    are the gather's, the same on every rank, so every rank returns the same answer.

    >>> rows = [RankRow(3, 3, 0, False, True), RankRow(0, 0, 0, False, False)]
    >>> group_bucket(rows, (1, 2, 4, 8))
    4
    """
    largest = 0
    for row in rows:
        if row.num_extends or row.num_tokens != row.batch_size:
            return None  # an extend or a multi-token decode: shapes a graph does not hold
        largest = max(largest, row.batch_size)
    return bucket_for(largest, sizes)
