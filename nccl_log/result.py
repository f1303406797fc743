"""What one nccl-tests run measured: frozen records shared by the text and JSON readers.

Both readers return the same ``NcclTestsResult`` so the verdict and the calibration never care
which format an operator captured.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Measurement:
    """One half of a result row: the out-of-place or the in-place run of one size."""

    time_us: float  # mean time of one collective, microseconds
    algbw_gbps: float  # bytes / time, GB/s (1e9)
    busbw_gbps: float  # algbw scaled by the collective's bus factor, GB/s
    num_wrong: int | None  # elements that failed validation; None when validation was off (N/A)


@dataclass(frozen=True, slots=True)
class SizeResult:
    """One measured message size (rows of size 0 are dropped by the readers)."""

    num_bytes: int  # the size column: for all_gather, the whole gathered buffer
    count: int  # elements per rank
    dtype: str
    redop: str
    root: int
    out_of_place: Measurement
    in_place: Measurement

    @property
    def num_wrong(self) -> int | None:
        """Wrong elements over both halves; None if either half was not validated."""
        halves = (self.out_of_place.num_wrong, self.in_place.num_wrong)
        return None if None in halves else sum(h for h in halves if h is not None)

    @property
    def min_busbw_gbps(self) -> float:
        """The slower half's bus bandwidth: what a fabric check should trust."""
        return min(self.out_of_place.busbw_gbps, self.in_place.busbw_gbps)


@dataclass(frozen=True, slots=True)
class RankInfo:
    """One ``#  Rank N Group G Pid P on HOST device D [BUS] NAME`` line."""

    rank: int
    group: int
    pid: int
    hostname: str
    device: int
    bus_id: str
    device_name: str


@dataclass(frozen=True, slots=True)
class RunParams:
    """The ``# nThread ... nGpus ... minBytes ...`` line: how the run was launched."""

    num_threads: int
    num_gpus: int  # GPUs per process (-g)
    min_bytes: int
    max_bytes: int
    warmup_iters: int
    iters: int
    validation: bool  # -c: off means every #wrong is N/A
    graph: int


@dataclass(frozen=True, slots=True)
class NcclTestsResult:
    """A parsed run. Footer fields are None when the output stops early (a crash or a cut log)."""

    sizes: tuple[SizeResult, ...]
    ranks: tuple[RankInfo, ...] = ()
    params: RunParams | None = None
    collective: str | None = None  # binary name, e.g. "all_gather_perf", when printed
    nccl_tests_version: str | None = None  # printed by nccl-tests >= 2.17 only
    nccl_version: str | None = None  # "2.26.6+cuda12.8" or, from JSON, "2.26.6"
    num_empty_rows: int = 0  # size-0 rows skipped (all_gather trims tiny sizes to 0)
    out_of_bounds: int | None = None  # "# Out of bounds values : N"
    avg_busbw_gbps: float | None = None  # "# Avg bus bandwidth : X"
    errors: tuple[str, ...] = ()  # "# error: ..." lines / the JSON "errors" list

    @property
    def num_ranks(self) -> int:
        """Ranks listed in the device report (0 when the report was not captured)."""
        return len(self.ranks)

    @property
    def has_footer(self) -> bool:
        """The run reached its summary: a missing footer means the output was truncated."""
        return self.out_of_bounds is not None and self.avg_busbw_gbps is not None

    @property
    def mean_busbw_gbps(self) -> float:
        """nccl-tests' own average, recomputed: busbw over every row and both halves.

        Size-0 rows count (as zeros), which is how nccl-tests computes its footer value.
        """
        num_halves = 2 * (len(self.sizes) + self.num_empty_rows)
        if num_halves == 0:
            return 0.0
        total = sum(s.out_of_place.busbw_gbps + s.in_place.busbw_gbps for s in self.sizes)
        return total / num_halves
