"""Either format of an nccl-tests run (the package docstring says why it is stdlib only)."""

from __future__ import annotations

from roundgate.nccl_log.json_report import parse_json
from roundgate.nccl_log.result import NcclTestsResult
from roundgate.nccl_log.text import parse_text


def parse(text: str) -> NcclTestsResult:
    """Parse either format: a ``-J`` report starts with ``{``, anything else is the text table."""
    if text.lstrip().startswith("{"):
        return parse_json(text)
    return parse_text(text)
