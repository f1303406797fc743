"""Policy registry test constants: the gate's flags, a small group, the built-ins, refusals."""

from __future__ import annotations

import re
from typing import Any

import pytest

from roundgate.actors.server_args import ServerArgs

GATE = {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}
# A small group: two ranks of 8 running requests each.
GROUP = {"dp_size": 2, "max_num_seqs": 16}
BUILTINS = (
    "roundgate",
    "roundgate-auto",
    "none",
    "local-interval",
    "sglang-delayer",
    "vllm-interval",
    "trtllm-balance",
    "vllm-alignment",
    "atom-coalescer",
    "tpu-dp-hold",
)


def make(**changes: Any) -> ServerArgs:
    return ServerArgs(**(GROUP | changes))


def refuses(text: str) -> Any:
    return pytest.raises(ValueError, match=re.escape(text))
