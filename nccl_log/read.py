"""Either format of an nccl-tests run: the text table every ``*_perf`` binary prints, or its
``-J`` report.

Pure stdlib on purpose, and low in the layers: the preflight Job's fabric verdict
(``python -m roundgate.k8s.tools.nccl_tests``) pipes the benchmark into it and must not pay for
importing torch, and ``roundgate calibrate`` (``roundgate.sim.gather_fit``) reads the same log
without the simulator depending on the operators' tools.
"""

from __future__ import annotations

from roundgate.nccl_log.json_report import parse_json
from roundgate.nccl_log.result import NcclTestsResult
from roundgate.nccl_log.text import parse_text


def parse(text: str) -> NcclTestsResult:
    """Parse either format: a ``-J`` report starts with ``{``, anything else is the text table."""
    if text.lstrip().startswith("{"):
        return parse_json(text)
    return parse_text(text)
