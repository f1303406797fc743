"""Incremental detokenization: new text per new tokens, in amortized O(1) per token.

Decoding a growing sequence from the start each time costs O(n) per token. Instead only a
short window is decoded (vLLM's prefix/read offsets): the text of the tokens after
``prefix_offset`` up to ``read_offset`` was already emitted; decoding from ``prefix_offset``
to the end and cutting that prefix gives the new text, with the context a tokenizer needs to
merge spaces and byte-fallback pieces right. Text ending in U+FFFD (half a UTF-8 character)
is held back until the character completes, or until the sequence ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int]) -> str: ...


class Detokenizer:
    """The text of one sequence, delta by delta; ``text`` is everything emitted so far."""

    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, token_ids: Sequence[int], final: bool = False) -> str:
        """The new text ``token_ids`` complete (``final``: flush what is held back)."""
        self.ids.extend(token_ids)
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix_offset : self.read_offset])
        after = decode(self.ids[self.prefix_offset :])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""  # nothing new yet, or half a character: wait for the rest
        delta = after[len(before) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += delta
        return delta
