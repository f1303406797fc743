"""The decode graphs' buckets: the sizes captured, one rank's bucket, and the group's bucket
every rank of an attention-DP group replays (from the round's gathered rows)."""

from __future__ import annotations

import pytest

from roundgate.actors.model.graph_buckets import bucket_for, capture_sizes, group_bucket
from roundgate.gate.rows import RankRow

SIZES = capture_sizes(20)  # (1, 2, 4, 8, 16, 20)


def decoding(batch: int) -> RankRow:
    """A rank decoding ``batch`` requests, one token each."""
    return RankRow(batch, batch, 0, False, batch > 0)


def extending(batch: int, tokens: int) -> RankRow:
    """A rank whose batch extends one prompt by ``tokens`` (the rest decode)."""
    return RankRow(batch - 1 + tokens, batch, 1, True, batch > 1)


@pytest.mark.parametrize(
    ("max_batch_size", "sizes"),
    [
        (1, (1,)),
        (3, (1, 2, 3)),
        (8, (1, 2, 4, 8)),
        (20, (1, 2, 4, 8, 16, 20)),
        (40, (1, 2, 4, 8, 16, 24, 32, 40)),
        (1000, (1, 2, 4, *range(8, 256, 8), 256)),
    ],
)
def test_capture_sizes(max_batch_size: int, sizes: tuple[int, ...]) -> None:
    assert capture_sizes(max_batch_size) == sizes


@pytest.mark.parametrize(
    ("batch_size", "bucket"),
    [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 20), (20, 20), (21, None), (0, None)],
)
def test_bucket_is_the_smallest_that_holds_the_batch(batch_size: int, bucket: int | None):
    assert bucket_for(batch_size, SIZES) == bucket


@pytest.mark.parametrize(
    ("rows", "bucket"),
    [
        # The largest rank's batch sets the bucket; the others pad to it.
        ([decoding(3), decoding(0), decoding(6), decoding(1)], 8),
        ([decoding(1), decoding(1)], 1),
        ([decoding(2), decoding(3)], 4),
        ([decoding(0), decoding(20)], 20),
        ([decoding(5)], 8),  # dp=1: the rank's own bucket
        # Nobody decodes: no forward at all, so nothing to replay.
        ([decoding(0), decoding(0)], None),
        # Some rank extends a prompt: the group's slow round runs eagerly everywhere.
        ([decoding(3), extending(2, 7)], None),
        # Some rank verifies drafts (several tokens a decode): shapes no bucket holds.
        ([decoding(3), RankRow(8, 2, 0, False, True)], None),
        # The largest batch is past the largest bucket.
        ([decoding(21), decoding(1)], None),
    ],
)
def test_the_group_bucket_comes_from_every_ranks_row(rows: list[RankRow], bucket: int | None):
    assert group_bucket(rows, SIZES) == bucket


def test_every_rank_picks_the_same_bucket_from_the_same_rows() -> None:
    """Each rank unpacks the gathered rows on its own; they are the same everywhere, so the
    bucket is too, though the ranks' own buckets differ."""
    rows = [decoding(b) for b in (0, 7, 2, 9, 0, 1, 16, 3)]
    gathered = [row.pack() for row in rows]
    picks = {group_bucket([RankRow.unpack(p) for p in gathered], SIZES) for _ in rows}
    assert picks == {16}
    assert {bucket_for(row.batch_size, SIZES) for row in rows} == {None, 1, 2, 4, 8, 16}
