"""One choice of one request: call a rank, detokenize incrementally, apply stop strings.

The rank stops on token ids (EOS, ``stop_token_ids``, ``max_tokens``); stop *strings* are
applied here, on text, and end the rank's stream early, which aborts the request there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from actors.control.messages import GenerateChunk, Usage
from actors.model.detokenizer import Detokenizer
from actors.model.tokenizer import Tokenizer


@dataclass
class Choice:
    """Progress of one generated sequence."""

    index: int
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    # The rank's count as of its last chunk (None until one arrives).
    usage: Usage | None = None


@dataclass(frozen=True)
class Delta:
    """New text of one choice since the previous delta (and its finish, when it ends)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


class RequestFailed(Exception):
    """The rank refused (``status`` 400) or failed (500) this one request; the group is fine."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


async def run_choice(
    stream: AsyncIterator[GenerateChunk],
    choice: Choice,
    tokenizer: Tokenizer,
    stop_strings: list[str],
) -> AsyncIterator[Delta]:
    """Turn the rank's token chunks into text deltas; stops at the first stop string.

    Text is detokenized incrementally. With stop strings, the last ``longest - 1`` characters
    are held back until more text shows they start no stop string, so what was streamed is
    always a prefix of the final text and the deltas join to exactly the non-streamed text.
    """
    detok = Detokenizer(tokenizer)
    hold = max((len(s) for s in stop_strings), default=1) - 1
    pending = ""  # decoded, not yet sent
    async for chunk in stream:
        if chunk.error is not None:
            raise RequestFailed(chunk.error, chunk.error_status)
        choice.output_token_ids.extend(chunk.token_ids)
        choice.usage = chunk.usage
        reason = chunk.finish_reason
        # Sent text never holds the start of a stop string (it would have been found while
        # the held-back tail was searched), so only the unsent text needs searching.
        pending += detok.add(chunk.token_ids, final=reason is not None)
        cut = first_stop(pending, stop_strings)
        if cut is not None:
            pending, reason = pending[:cut], "stop"
        send = len(pending) if reason is not None else max(0, len(pending) - hold)
        delta, pending = pending[:send], pending[send:]
        choice.text += delta
        if reason is not None:
            choice.finish_reason = reason
        if delta or reason is not None or chunk.token_ids:
            yield Delta(choice.index, delta, list(chunk.token_ids), reason)
        if cut is not None:
            return  # leaving the stream cancels it: the rank aborts the request


def first_stop(text: str, stops: list[str]) -> int | None:
    """Where ``text`` is cut: the start of the stop string that completes first (as if the
    text arrived one character at a time), so the cut never depends on how it was chunked."""
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    return min(hits)[1] if hits else None
