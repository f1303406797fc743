"""nccl-tests for the operators: build the ``all_gather_perf`` command, judge the fabric.

Pure stdlib on purpose: the preflight Job pipes the benchmark into ``python -m
k8s.tools.nccl_tests`` and must not pay for importing torch. The log itself is read by
``nccl_log`` (re-exported here), which ``roundgate calibrate`` reads it with too.
"""

from roundgate.k8s.tools.nccl_tests.command import all_gather_command
from roundgate.k8s.tools.nccl_tests.verdict import FabricVerdict, check_fabric, small_latency_us
from roundgate.nccl_log.json_report import parse_json
from roundgate.nccl_log.read import parse
from roundgate.nccl_log.result import Measurement, NcclTestsResult, RankInfo, RunParams, SizeResult
from roundgate.nccl_log.text import parse_text

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
