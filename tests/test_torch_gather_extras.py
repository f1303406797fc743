"""The torch.distributed gather carries a policy's extra columns in the same single row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from actors.replica.torch_gather import TorchGather
from gate import RankRow


@pytest.fixture
def gloo_group(tmp_path) -> Iterator[None]:
    """A one-rank gloo group: enough to run the real collective and its packing."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("gloo_group")
def test_rows_with_and_without_extras_round_trip() -> None:
    gather = TorchGather()
    plain = RankRow(12, 3, 1, True, False)
    (got,) = [RankRow.unpack(p) for p in gather.all_gather(plain.pack())]
    assert got == plain and got.extras == ()
    # A peer policy's columns (SGLang's six, one of them a wall-clock ms stamp) in the same row.
    wide = RankRow(4, 4, 0, True, True, (1, 912, 4, 2, 7, 1_764_000_000_123))
    (got,) = [RankRow.unpack(p) for p in gather.all_gather(wide.pack())]
    assert got == wide and got.extras == wide.extras
