"""nccl-tests outputs the parser tests run over, and what each one holds.

Keys are ``repo:<name>`` (``tests/data/nccl-tests``, written here, always present) and
``shared:<name>`` (real logs in ``../shared/nccl-tests-samples``, skipped when absent).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from shared_data import DATA, shared_dir

REPO_SAMPLES = DATA / "nccl-tests"
SHARED_SAMPLES = shared_dir("nccl-tests-samples")
needs_shared = pytest.mark.skipif(
    SHARED_SAMPLES is None, reason="../shared/nccl-tests-samples absent (extra real logs only)"
)

# key: (collective, ranks, sizes, empty rows, first B, last B, footer avg, total wrong)
EXPECTED: dict[str, tuple[Any, ...]] = {
    "repo:allgather_4gpu_ok.txt": ("all_gather_perf", 4, 23, 3, 64, 256 << 20, 32.9042, 0),
    "repo:allgather_2gpu_novalid.txt": ("all_gather_perf", 2, 15, 0, 256, 4 << 20, 3.68867, 0),
    "repo:allreduce_2host_ok.txt": (None, 2, 20, 0, 1024, 512 << 20, 11.1952, 0),
    "repo:allreduce_8gpu_wrong.txt": ("all_reduce_perf", 8, 20, 0, 64, 32 << 20, None, 1736570),
    "shared:sample_1.txt": (None, 2, 26, 2, 32, 1 << 30, 12.5463, 0),
    "shared:sample_2.txt": (None, 2, 24, 0, 1024, 8 << 30, 15.5188, 0),
    "shared:sample_3.txt": (None, 16, 31, 0, 8, 8 << 30, 70.742, 0),
    "shared:sample_4.txt": (None, 16, 5, 0, 1 << 30, 16 << 30, 467.089, 0),
    "shared:sample_5.txt": (None, 0, 28, 4, 128, 16 << 30, 207.963, 0),
    "shared:sample_6.txt": ("all_reduce_perf", 16, 28, 0, 1, 128 << 20, None, 3935945),
    "shared:sample_7.txt": ("all_reduce_perf", 16, 24, 0, 1024, 8 << 30, 21.8363, 0),
}
# key: (min busbw GB/s, max small latency us, expected ok, a phrase the summary must contain)
VERDICTS: dict[str, tuple[Any, ...]] = {
    "repo:allgather_4gpu_ok.txt": (100.0, 10.0, True, "105.91 GB/s at 268435456 B"),
    "repo:allgather_2gpu_novalid.txt": (5.0, 10.0, False, "validation was off"),
    "repo:allreduce_2host_ok.txt": (20.0, 40.0, True, "latency 29.3 us"),
    "repo:allreduce_8gpu_wrong.txt": (10.0, None, False, "wrong elements at 3 sizes"),
    "shared:sample_1.txt": (30.0, 20.0, True, ""),
    "shared:sample_2.txt": (30.0, 40.0, True, ""),
    "shared:sample_3.txt": (300.0, 150.0, True, ""),
    "shared:sample_4.txt": (450.0, None, True, ""),
    "shared:sample_5.txt": (600.0, 20.0, True, ""),
    "shared:sample_6.txt": (50.0, None, False, "wrong elements"),
    "shared:sample_7.txt": (40.0, 100.0, True, ""),
}


# The all_gather runs, the repo's and ../shared's: the collective calibrate and the JSON
# export read from a log.
ALL_GATHER_SAMPLES = (
    "repo:allgather_4gpu_ok.txt",
    "repo:allgather_2gpu_novalid.txt",
    "shared:sample_1.txt",
    "shared:sample_5.txt",
)


def sample_path(key: str) -> Path:
    """The file behind a key; only call it for a ``shared:`` key under ``needs_shared``."""
    origin, name = key.split(":", 1)
    if origin == "repo":
        return REPO_SAMPLES / name
    assert SHARED_SAMPLES is not None, f"{key} needs ../shared (mark the case needs_shared)"
    return SHARED_SAMPLES / name


def read(key: str) -> str:
    return sample_path(key).read_text()


def cases(*rows: Any) -> list[Any]:
    """``pytest.param`` per row whose first item is a key; ``shared:`` rows skip when absent."""
    out = []
    for row in rows:
        values = row if isinstance(row, tuple) else (row,)
        marks = [needs_shared] if values[0].startswith("shared:") else []
        out.append(pytest.param(*values, marks=marks, id=values[0] if len(values) == 1 else None))
    return out
