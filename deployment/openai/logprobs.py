"""The ``logprobs`` objects of OpenAI's completion and chat choices, and each token's text.

Logprobs are the raw model distribution (before penalties, bias, temperature and cuts; vLLM's
default), so the same request with other sampling settings reports the same numbers for the
same tokens. A token's text is its own decoding (a token that ends inside a UTF-8 character
shows the replacement character; its ``bytes`` are those of that text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from roundgate.actors.control.request import TokenLogprobs
from roundgate.actors.model.tokenizer import Tokenizer

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


class TokenIdTexts(TokenTexts):
    """vLLM's ``return_tokens_as_token_ids``: each token of a ``logprobs`` object named
    ``token_id:N``, so a client maps it back to its id even where the text cannot say which
    (a token that ends inside a UTF-8 character, two tokens with the same text)."""

    def __call__(self, token_id: int) -> str:
        return f"token_id:{token_id}"


def logprob_texts(texts: TokenTexts, as_token_ids: bool | None) -> TokenTexts:
    """How a request's ``logprobs`` name tokens: their text, or ``token_id:N``."""
    return TokenIdTexts(texts.tokenizer) if as_token_ids else texts


def _finite(value: float) -> float:
    return max(value, MIN_LOGPROB)


class EchoedPrompt(NamedTuple):
    """The prompt part of an ``echo`` + ``logprobs`` answer: its ids, their logprobs (one per
    token from the second on), the ``k`` asked for, and where the output's text starts."""

    token_ids: Sequence[int]
    logprobs: Sequence[TokenLogprobs]
    k: int
    text_len: int


def _top(texts: TokenTexts, token: int, lp: TokenLogprobs, k: int) -> dict[str, float]:
    top: dict[str, float] = {}
    for tid, value in zip(lp.top_ids[:k], lp.top_logprobs[:k], strict=True):
        top.setdefault(texts(tid), _finite(value))
    top.setdefault(texts(token), _finite(lp.logprob))
    return top


def completion_logprobs(
    texts: TokenTexts,
    token_ids: Sequence[int],
    logprobs: Sequence[TokenLogprobs],
    offsets: Sequence[int],
    prompt: EchoedPrompt | None = None,
) -> dict[str, Any]:
    """The completions ``logprobs`` object: the sampled tokens and their top ``k``.

    ``top_logprobs`` maps each of the ``k`` most likely tokens' text to its logprob, plus the
    sampled token (vLLM's shape); two tokens with the same text keep the likelier. With
    ``prompt`` (``echo``), the prompt's tokens come first, the first of them with ``null``
    logprobs (nothing predicts it, as OpenAI and vLLM), and the output's offsets follow the
    echoed text.
    """
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    starts: list[int] = []
    shift = 0
    if prompt is not None:
        offset = 0
        for i, token in enumerate(prompt.token_ids):
            tokens.append(texts(token))
            starts.append(offset)
            offset += len(tokens[-1])
            lp = prompt.logprobs[i - 1] if 0 < i <= len(prompt.logprobs) else None
            values.append(None if lp is None else _finite(lp.logprob))
            tops.append(None if lp is None else _top(texts, token, lp, prompt.k))
        shift = prompt.text_len
    for token, lp in zip(token_ids, logprobs, strict=True):
        tokens.append(texts(token))
        values.append(_finite(lp.logprob))
        tops.append(_top(texts, token, lp, len(lp.top_ids)))
    starts += [shift + o for o in offsets]
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": starts}


def vllm_prompt_logprobs(
    texts: TokenTexts, prompt_ids: Sequence[int], logprobs: Sequence[TokenLogprobs], k: int
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: ``null`` for the first token, then per token a map from
    token id to ``{logprob, rank, decoded_token}``: the prompt's own token, then the top ``k``
    (ranks 1..k)."""
    out: list[dict[str, dict[str, Any]] | None] = [None]
    for token, lp in zip(prompt_ids[1:], logprobs, strict=False):  # short if it failed
        entry = {str(token): _vllm_entry(texts, token, lp.logprob, lp.rank)}
        tops = zip(lp.top_ids[:k], lp.top_logprobs[:k], strict=True)
        for rank, (tid, value) in enumerate(tops, 1):
            entry.setdefault(str(tid), _vllm_entry(texts, tid, value, rank))
        out.append(entry)
    return out


def _vllm_entry(texts: TokenTexts, token: int, logprob: float, rank: int | None) -> dict[str, Any]:
    return {"logprob": _finite(logprob), "rank": rank, "decoded_token": texts(token)}


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
