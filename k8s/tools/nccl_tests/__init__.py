"""nccl-tests for the operators: build the ``all_gather_perf`` command, judge the fabric.

Pure stdlib on purpose: the preflight Job pipes the benchmark into ``python -m
k8s.tools.nccl_tests`` and must not pay for importing torch. The log itself is read by
``nccl_log`` (re-exported here), which ``roundgate calibrate`` reads it with too.
"""

from k8s.tools.nccl_tests.command import all_gather_command
from k8s.tools.nccl_tests.verdict import FabricVerdict, check_fabric, small_latency_us
from nccl_log import (
    Measurement,
    NcclTestsResult,
    RankInfo,
    RunParams,
    SizeResult,
    parse,
    parse_json,
    parse_text,
)

__all__ = [
    "FabricVerdict",
    "Measurement",
    "NcclTestsResult",
    "RankInfo",
    "RunParams",
    "SizeResult",
    "all_gather_command",
    "check_fabric",
    "parse",
    "parse_json",
    "parse_text",
    "small_latency_us",
]
