"""What a prefill policy lets one rank plan this round: new prompts, resident chunks, or both.

A plain open/closed bit is not enough for the peers: SGLang's delayer holds new requests but
lets a rank finish the chunk it is in the middle of, while vLLM's interval and our gate hold
both. The scheduler reads the two bits separately.
"""

from __future__ import annotations

from typing import NamedTuple


class Permission(NamedTuple):
    """``allow_new``: admit waiting prompts. ``allow_chunks``: continue resident prefill."""

    allow_new: bool
    allow_chunks: bool


ALLOW_ALL = Permission(True, True)
HOLD_ALL = Permission(False, False)
CHUNKS_ONLY = Permission(False, True)
NEW_ONLY = Permission(True, False)
