"""The simulator's per-round metadata gather, fitted to a measured ``all_gather_perf`` run.

Every round each rank all-gathers one row of int64 columns, so the gathered buffer holds
``dp_size * num_columns * 8`` bytes: a few hundred bytes, far below where bandwidth matters.
Its cost is the all-gather latency at that size, read off the measured curve by interpolating
between the two nearest measured sizes (in log2 of the size, the axis nccl-tests steps along).
The log is read by ``nccl_log``; ``roundgate calibrate`` (``roundgate.sim.calibration``) calls this.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass

from roundgate.gate.rows import NUM_COLUMNS
from roundgate.nccl_log.result import NcclTestsResult

# The gate's columns of one rank's gathered row; a policy's extra columns come on top
# (``roundgate.sim.calibration.gather_columns`` counts them).
METADATA_COLUMNS = NUM_COLUMNS
INT64_BYTES = 8


@dataclass(frozen=True, slots=True)
class LatencyFit:
    """``time_us ≈ latency_us + num_bytes / bandwidth`` over the small sizes."""

    latency_us: float  # intercept: the fixed cost of one small all-gather
    us_per_kib: float  # slope; near zero at small sizes
    num_points: int


@dataclass(frozen=True, slots=True)
class GatherCalibration:
    """The per-round metadata gather cost for one DP size, with where it came from."""

    dp_size: int
    num_bytes: int
    time_us: float  # interpolated at num_bytes
    latency: LatencyFit


def metadata_gather_bytes(dp_size: int, num_columns: int = METADATA_COLUMNS) -> int:
    """Bytes of the gathered buffer: one int64 row per rank.

    >>> metadata_gather_bytes(8)
    320
    """
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    return dp_size * num_columns * INT64_BYTES


def interpolate_time_us(result: NcclTestsResult, num_bytes: int) -> float:
    """Out-of-place time at ``num_bytes``: linear in log2(size) between measured neighbours.

    Below the smallest measured size the smallest size's time is the floor (latency-bound);
    above the largest, time grows linearly with size (bandwidth-bound).
    """
    points = sorted((s.num_bytes, s.out_of_place.time_us) for s in result.sizes)
    if not points:
        raise ValueError("no measured sizes to interpolate")
    sizes = [size for size, _ in points]
    if num_bytes <= sizes[0]:
        return points[0][1]
    if num_bytes >= sizes[-1]:
        return points[-1][1] * num_bytes / sizes[-1]
    right = bisect.bisect_left(sizes, num_bytes)
    (x0, y0), (x1, y1) = points[right - 1], points[right]
    if x1 == num_bytes:
        return y1
    weight = (math.log2(num_bytes) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
    return y0 + weight * (y1 - y0)


def fit_latency(result: NcclTestsResult, max_bytes: int = 4096) -> LatencyFit:
    """Least-squares line through the out-of-place times of sizes up to ``max_bytes``."""
    points = [
        (s.num_bytes, s.out_of_place.time_us) for s in result.sizes if s.num_bytes <= max_bytes
    ]
    if not points:
        raise ValueError(f"no measured sizes up to {max_bytes} B to fit a latency")
    if len(points) == 1:
        return LatencyFit(latency_us=points[0][1], us_per_kib=0.0, num_points=1)
    sizes, times = zip(*points, strict=True)
    slope, intercept = statistics.linear_regression(sizes, times)
    return LatencyFit(latency_us=intercept, us_per_kib=slope * 1024, num_points=len(points))


def calibrate_metadata_gather(
    result: NcclTestsResult, dp_size: int, num_columns: int = METADATA_COLUMNS
) -> GatherCalibration:
    """The simulator's "per-round metadata gather" cost for ``dp_size`` ranks.

    Refuses runs of another collective: an all-reduce curve is not an all-gather curve.
    """
    if result.collective is not None and "all_gather" not in result.collective:
        raise ValueError(f"calibration needs an all_gather_perf run, got {result.collective}")
    num_bytes = metadata_gather_bytes(dp_size, num_columns)
    return GatherCalibration(
        dp_size=dp_size,
        num_bytes=num_bytes,
        time_us=interpolate_time_us(result, num_bytes),
        latency=fit_latency(result),
    )


def gather_cost_overrides(calibration: GatherCalibration, base: str = "toy") -> dict[str, object]:
    """A ``simulate --costs FILE.json`` object that sets ``gather_ms`` from the measurement.

    This is the device-side collective only; the scheduler-level gather adds host sync on top
    (docs/calibration.md, "The metadata gather"), so compare before replacing a preset's value.
    """
    return {"base": base, "gather_ms": round(calibration.time_us / 1000.0, 6)}
