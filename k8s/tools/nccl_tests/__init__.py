"""nccl-tests: build the ``all_gather_perf`` command, parse its output, judge the fabric.

Pure stdlib on purpose: the preflight Job pipes the benchmark into ``python -m
k8s.tools.nccl_tests`` and must not pay for importing torch.
"""

from k8s.tools.nccl_tests.calibrate import (
    GatherCalibration,
    LatencyFit,
    calibrate_metadata_gather,
    fit_latency,
    gather_cost_overrides,
    interpolate_time_us,
    metadata_gather_bytes,
)
from k8s.tools.nccl_tests.command import all_gather_command
from k8s.tools.nccl_tests.json_report import parse_json
from k8s.tools.nccl_tests.result import (
    Measurement,
    NcclTestsResult,
    RankInfo,
    RunParams,
    SizeResult,
)
from k8s.tools.nccl_tests.text import parse_text
from k8s.tools.nccl_tests.verdict import FabricVerdict, check_fabric, small_latency_us


def parse(text: str) -> NcclTestsResult:
    """Parse either format: a ``-J`` report starts with ``{``, anything else is the text table."""
    if text.lstrip().startswith("{"):
        return parse_json(text)
    return parse_text(text)


__all__ = [
    "FabricVerdict",
    "GatherCalibration",
    "LatencyFit",
    "Measurement",
    "NcclTestsResult",
    "RankInfo",
    "RunParams",
    "SizeResult",
    "all_gather_command",
    "calibrate_metadata_gather",
    "check_fabric",
    "fit_latency",
    "gather_cost_overrides",
    "interpolate_time_us",
    "metadata_gather_bytes",
    "parse",
    "parse_json",
    "parse_text",
    "small_latency_us",
]
