"""One choice of one request: call a rank, detokenize incrementally, apply stop strings.

The rank stops on token ids (EOS, ``stop_token_ids``, ``max_tokens``); stop *strings* are
applied here, on text, and end the rank's stream early, which aborts the request there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from actors.control.messages import GenerateChunk, Usage
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


async def run_choice(
    stream: AsyncIterator[GenerateChunk],
    choice: Choice,
    tokenizer: Tokenizer,
    stop_strings: list[str],
) -> AsyncIterator[Delta]:
    """Turn the rank's token chunks into text deltas; stops at the first stop string."""
    async for chunk in stream:
        choice.output_token_ids.extend(chunk.token_ids)
        choice.usage = chunk.usage
        full = tokenizer.decode(choice.output_token_ids)
        reason = chunk.finish_reason
        cut = _first_stop(full, stop_strings)
        if cut is not None:
            full, reason = full[:cut], "stop"
        elif reason is None and full.endswith("\ufffd"):
            continue  # half a UTF-8 character: wait for the rest
        delta = full[len(choice.text) :] if full.startswith(choice.text) else full
        choice.text = full
        if reason is not None:
            choice.finish_reason = reason
        yield Delta(choice.index, delta, list(chunk.token_ids), reason)
        if cut is not None:
            return  # leaving the stream cancels it: the rank aborts the request


def _first_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
