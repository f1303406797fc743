"""The gather's wire form, in process: rows packed into one int64 tensor and read back in one
``tolist`` (the gloo and NCCL gathers both run these two functions)."""

from __future__ import annotations

import pytest
import torch

from roundgate.actors.replica.torch_gather import pack_rows, unpack_rows

STAMP_MS = 1_764_000_000_123  # past 32 bits: the wire form is int64


@pytest.mark.parametrize(
    "rows",
    [
        [(3, 3, 0, 1, 1)],
        [(3, 3, 0, 1, 1), (0, 0, 0, 0, 0)],
        [(1, 1, 1, 1, 0, STAMP_MS, -1), (0, 0, 0, 0, 1, STAMP_MS + 7, 2), (5,) * 7],
    ],
)
def test_rows_round_trip_through_one_tensor(rows: list[tuple[int, ...]]) -> None:
    packed = pack_rows(rows)
    assert packed.dtype == torch.int64
    assert tuple(packed.shape) == (len(rows), len(rows[0]))
    assert unpack_rows(packed) == rows


def test_unpacking_reads_the_tensor_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    tolist = torch.Tensor.tolist

    def counted(self: torch.Tensor) -> object:
        calls.append(tuple(self.shape))
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    gathered = pack_rows([(i, i + 1, 0, 1, 0) for i in range(8)])  # dp=8's gathered rows
    assert len(unpack_rows(gathered)) == 8
    assert calls == [(8, 5)]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([], "at least one non-empty row"),
        ([()], "at least one non-empty row"),
        ([(1, 2, 3), (1, 2)], r"one width, got widths \[2, 3\]"),
    ],
)
def test_packing_refuses_rows_a_gather_cannot_carry(rows: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pack_rows(rows)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (torch.zeros(5, dtype=torch.int64), r"of shape \(5,\)"),
        (torch.zeros(2, 5, dtype=torch.int32), "got torch.int32"),
    ],
)
def test_unpacking_refuses_what_no_gather_returns(tensor: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        unpack_rows(tensor)
