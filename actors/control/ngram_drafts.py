"""n-gram drafts (prompt lookup): guess a request's next tokens from its own history.

A request that copies from its prompt (a rewrite with one change, a quote, code edited in
place) repeats long runs of tokens it has already seen. The drafter finds the request's
last ``n`` tokens earlier in its history (prompt then output) and proposes the up to ``k``
tokens that followed them there; the target model then verifies all of them in one forward
(``roundgate.actors.model.spec_verify``). No weights, any model: vLLM's ``ngram`` method and
llama.cpp's lookup decoding do the same.

The match rules, chosen so a draft is cheap and stable:

- the longest ``n`` from ``max_n`` down to ``min_n`` that matches wins (a longer context is
  a better predictor);
- among the earlier occurrences of that n-gram, the most recent one (the nearest text is the
  one being copied);
- the occurrence must be strictly earlier than the suffix itself, and at least one token must
  follow it.

``propose_ngram`` scans the history (the reference); ``NgramIndex`` gives the same drafts
from an index it extends by the tokens added since the last call, so a request's lookup each
round costs its new tokens, not its whole history (measured on an 800-token history with no
match: 148 us a lookup by scan, 5 us by index; eight requests' scans would be over a tenth of
a CPU rank's ~12 ms decode round).

Pure: token ids in, token ids out, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(tokens: Sequence[int], min_n: int, max_n: int, k: int) -> tuple[int, ...]:
    """Up to ``k`` draft tokens continuing ``tokens``, or ``()`` when no n-gram of length
    ``min_n``..``max_n`` ending the history occurred before."""
    if not 1 <= min_n <= max_n:
        raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {min_n}, {max_n}")
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    history = list(tokens)
    size = len(history)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = history[size - n :]
        last = suffix[-1]
        # Latest start first; a start at size - n is the suffix itself. The last token is
        # compared alone before the slice (most starts fail there).
        for start in range(size - n - 1, -1, -1):
            if history[start + n - 1] == last and history[start : start + n] == suffix:
                follow = start + n
                return tuple(history[follow : follow + k])
    return ()


class NgramIndex:
    """One request's n-grams (lengths ``min_n`` to ``max_n``), each with the start of its
    most recent occurrence that has a token after it; grown as the request's history grows."""

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {min_n}, {max_n}"
            )
        self.min_n = min_n
        self.max_n = max_n
        self.tokens: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in ``_last``

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append the history's next tokens."""
        self.tokens.extend(new_tokens)

    def propose(self, k: int) -> tuple[int, ...]:
        """What ``propose_ngram(history, min_n, max_n, k)`` returns for the history so far."""
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
        tokens = self.tokens
        size = len(tokens)
        last = self._last
        # Index every n-gram ending at or before size - 2 (one that has a token after it).
        for end in range(self._indexed, size - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                last[tuple(tokens[end - n + 1 : end + 1])] = end - n + 1
        self._indexed = max(self._indexed, size - 1)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            start = last.get(tuple(tokens[size - n :]))
            if start is not None:
                follow = start + n
                return tuple(tokens[follow : follow + k])
        return ()
