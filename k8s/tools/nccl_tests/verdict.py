"""Is the fabric good enough to trust round-cost numbers measured on it?

The checks, in the order an operator would look: did the run finish (exit code, footer), did
every rank join, did the data arrive intact (out-of-bounds footer, every #wrong zero), and is it
fast enough (bus bandwidth at the largest size, latency at the smallest sizes).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from roundgate.nccl_log.result import NcclTestsResult

SMALL_MAX_BYTES = 4096  # sizes up to this count as "small" for the latency figure


@dataclass(frozen=True, slots=True)
class FabricVerdict:
    """The outcome: ``ok`` iff ``reasons`` is empty, plus the two figures that were judged."""

    reasons: tuple[str, ...]
    largest_bytes: int | None
    largest_busbw_gbps: float | None
    small_latency_us: float | None

    @property
    def ok(self) -> bool:
        return not self.reasons

    def summary(self) -> str:
        """One line for a Job log: the verdict, then every reason or the judged figures."""
        if not self.ok:
            return "FAIL: " + "; ".join(self.reasons)
        latency = "n/a" if self.small_latency_us is None else f"{self.small_latency_us:.1f} us"
        return (
            f"OK: busbw {self.largest_busbw_gbps:.2f} GB/s at {self.largest_bytes} B, "
            f"small-size latency {latency}"
        )


def small_latency_us(result: NcclTestsResult, max_bytes: int = SMALL_MAX_BYTES) -> float | None:
    """Median out-of-place time over sizes up to ``max_bytes`` (robust to one slow warm-up row)."""
    times = [s.out_of_place.time_us for s in result.sizes if s.num_bytes <= max_bytes]
    return statistics.median(times) if times else None


def check_fabric(
    result: NcclTestsResult,
    min_busbw_gbps: float,
    *,
    expected_ranks: int | None = None,
    max_small_latency_us: float | None = None,
    exit_code: int | None = None,
    require_footer: bool = True,
    require_validation: bool = True,
) -> FabricVerdict:
    """Judge one run; every failed check adds a reason, so one look shows all that is wrong."""
    reasons: list[str] = []
    if exit_code not in (None, 0):
        reasons.append(f"nccl-tests exited with code {exit_code}")
    reasons += [f"nccl-tests reported an error: {error}" for error in result.errors]
    if require_footer and not result.has_footer:
        reasons.append("output ends before the summary footer (crashed or truncated run)")
    if expected_ranks is not None and result.num_ranks != expected_ranks:
        reasons.append(f"{result.num_ranks} ranks reported, expected {expected_ranks}")
    if result.out_of_bounds:
        reasons.append(f"{result.out_of_bounds} out-of-bounds values")
    wrong = [s for s in result.sizes if s.num_wrong]
    if wrong:
        sizes = ", ".join(str(s.num_bytes) for s in wrong[:3]) + (", ..." if len(wrong) > 3 else "")
        total = sum(s.num_wrong or 0 for s in wrong)
        reasons.append(f"{total} wrong elements at {len(wrong)} sizes ({sizes} B)")
    if require_validation and any(s.num_wrong is None for s in result.sizes):
        reasons.append("data validation was off (#wrong is N/A); rerun with -c 1")

    largest = max(result.sizes, key=lambda s: s.num_bytes, default=None)
    latency = small_latency_us(result)
    if largest is None:
        reasons.append("no measured sizes in the output")
    elif largest.min_busbw_gbps < min_busbw_gbps:
        reasons.append(
            f"busbw {largest.min_busbw_gbps:.2f} GB/s at {largest.num_bytes} B is below "
            f"the minimum {min_busbw_gbps:g} GB/s"
        )
    if max_small_latency_us is not None:
        if latency is None:
            reasons.append(f"no sizes up to {SMALL_MAX_BYTES} B to judge latency")
        elif latency > max_small_latency_us:
            reasons.append(
                f"small-size latency {latency:.1f} us is above the maximum "
                f"{max_small_latency_us:g} us"
            )
    return FabricVerdict(
        reasons=tuple(reasons),
        largest_bytes=largest.num_bytes if largest else None,
        largest_busbw_gbps=largest.min_busbw_gbps if largest else None,
        small_latency_us=latency,
    )
