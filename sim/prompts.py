"""The token ids of simulated prompts: what the prefix caches and the cache-aware router read."""

from __future__ import annotations

from roundgate.sim.arrivals import Arrival


class FillerPrompts:
    """A session turn's own tokens, else filler distinct per request: 4 leading digits of its
    index, then a shared tail of ones, so unrelated prompts never share a cached page (only
    the prefix cache reads token values)."""

    def __init__(self, vocab_size: int) -> None:
        self._distinct = max(2, vocab_size - 2)  # the digits' base
        self._tails: dict[int, list[int]] = {}  # shared prompt tails, by length

    def make(self, index: int, arrival: Arrival) -> list[int]:
        if arrival.token_ids is not None:
            return list(arrival.token_ids)
        length = arrival.prompt_tokens
        head = [2 + index // self._distinct**k % self._distinct for k in range(min(4, length))]
        tail = self._tails.get(length - len(head))
        if tail is None:
            tail = self._tails[length - len(head)] = [1] * (length - len(head))
        return head + tail
