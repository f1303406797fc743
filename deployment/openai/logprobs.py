"""The ``logprobs`` objects of OpenAI's completion and chat choices, and each token's text.

Logprobs are the raw model distribution (before penalties, bias, temperature and cuts; vLLM's
default), so the same request with other sampling settings reports the same numbers for the
same tokens. A token's text is its own decoding (a token that ends inside a UTF-8 character
shows the replacement character; its ``bytes`` are those of that text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.control.request import TokenLogprobs
from actors.model.tokenizer import Tokenizer

# JSON has no -inf: a token the model gives no probability at all reports this (as vLLM does).
MIN_LOGPROB = -9999.0


class TokenTexts:
    """Each token id's own text, decoded once per process."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id])
        return text


def _finite(value: float) -> float:
    return max(value, MIN_LOGPROB)


def completion_logprobs(
    texts: TokenTexts,
    token_ids: Sequence[int],
    logprobs: Sequence[TokenLogprobs],
    offsets: Sequence[int],
) -> dict[str, Any]:
    """The completions ``logprobs`` object: the sampled tokens and their top ``k``.

    ``top_logprobs`` maps each of the ``k`` most likely tokens' text to its logprob, plus the
    sampled token (vLLM's shape); two tokens with the same text keep the likelier.
    """
    tops = []
    for token, lp in zip(token_ids, logprobs, strict=True):
        top: dict[str, float] = {}
        for tid, value in zip(lp.top_ids, lp.top_logprobs, strict=True):
            top.setdefault(texts(tid), _finite(value))
        top.setdefault(texts(token), _finite(lp.logprob))
        tops.append(top)
    return {
        "tokens": [texts(t) for t in token_ids],
        "token_logprobs": [_finite(lp.logprob) for lp in logprobs],
        "top_logprobs": tops,
        "text_offset": list(offsets),
    }


def _chat_entry(texts: TokenTexts, token_id: int, logprob: float) -> dict[str, Any]:
    text = texts(token_id)
    return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(
    texts: TokenTexts, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs]
) -> dict[str, Any]:
    """The chat ``logprobs`` object: per token its text, logprob, bytes and top ``k``."""
    content = []
    for token, lp in zip(token_ids, logprobs, strict=True):
        entry = _chat_entry(texts, token, lp.logprob)
        entry["top_logprobs"] = [
            _chat_entry(texts, tid, value)
            for tid, value in zip(lp.top_ids, lp.top_logprobs, strict=True)
        ]
        content.append(entry)
    return {"content": content, "refusal": None}
