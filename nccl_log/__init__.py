"""An nccl-tests run, read: the text table every ``*_perf`` binary prints, or its ``-J`` report.

Pure stdlib on purpose, and low in the layers: the preflight Job's fabric verdict
(``python -m k8s.tools.nccl_tests``) pipes the benchmark into it and must not pay for importing
torch, and ``roundgate calibrate`` (``sim.gather_fit``) reads the same log without the
simulator depending on the operators' tools.
"""

from nccl_log.json_report import parse_json
from nccl_log.result import Measurement, NcclTestsResult, RankInfo, RunParams, SizeResult
from nccl_log.text import parse_text


def parse(text: str) -> NcclTestsResult:
    """Parse either format: a ``-J`` report starts with ``{``, anything else is the text table."""
    if text.lstrip().startswith("{"):
        return parse_json(text)
    return parse_text(text)


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
