"""An nccl-tests run, read: the text table every ``*_perf`` binary prints, or its ``-J`` report.

Pure stdlib on purpose, and low in the layers: the preflight Job's fabric verdict
(``python -m roundgate.k8s.tools.nccl_tests``) pipes the benchmark into it and must not pay for
importing torch, and ``roundgate calibrate`` (``roundgate.sim.gather_fit``) reads the same log
without the simulator depending on the operators' tools.
"""

from roundgate.nccl_log.json_report import parse_json
from roundgate.nccl_log.read import parse
from roundgate.nccl_log.result import Measurement, NcclTestsResult, RankInfo, RunParams, SizeResult
from roundgate.nccl_log.text import parse_text

__all__ = [
    "Measurement",
    "NcclTestsResult",
    "RankInfo",
    "RunParams",
    "SizeResult",
    "parse",
    "parse_json",
    "parse_text",
]
