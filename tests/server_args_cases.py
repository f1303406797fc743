"""ServerArgs test constants: the gate's flags and values, the context length, a refusal."""

from __future__ import annotations

import re
from typing import Any

import pytest

ATTEMPT = "--prefill-attempt-interval"
ANY = "--prefill-any-attempt-interval"
GATE = {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}
GATE_CLI = [ATTEMPT, "4", ANY, "16"]
CONTEXT = 4096  # the presets' max_position_embeddings
LOCAL_ONLY = "--prefill-decode-interval applies to --prefill-policy local-interval only"


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def refuses(flag: str) -> Any:
    return pytest.raises(ValueError, match=re.escape(flag))
