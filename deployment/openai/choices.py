"""The choices of one HTTP request: text from the ranks' token streams, and what they add up to.

Each choice is detokenized incrementally and cut at its stop strings: the rank stops on token
ids (EOS, ``stop_token_ids``, ``max_tokens``); stop *strings* are applied here, on text, and
end the rank's stream early, which aborts the request there. The choices of several rank
requests (one per prompt) run at once (``merge``); their ``usage`` is the ranks' counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from roundgate.actors.control.messages import GenerateChunk, Usage
from roundgate.actors.control.request import TokenLogprobs
from roundgate.actors.model.detokenizer import Detokenizer
from roundgate.actors.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class Delta:
    """New text of one choice since the previous delta (and its finish, when it ends).

    A value, not a view of its ``Choice``: with several prompts, ``merge``'s pumps run ahead
    of the consumer, so a choice may have taken its next chunk before this delta is sent.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[TokenLogprobs] | None = None  # one per token id, when asked for
    text_offsets: list[int] | None = None  # where each token's text starts in the choice


class _KeepSpecial:
    """A tokenizer's decoding with special tokens kept (``skip_special_tokens: false``)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)


class RequestFailed(Exception):
    """The rank refused (``status`` 400) or failed (500) this one request; the group is fine."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Choice:
    """One generated sequence of a request: its text, detokenized incrementally and cut at its
    stop strings as the rank's chunks arrive, and everything its body reports.

    With stop strings, the last ``longest - 1`` characters are held back until more text shows
    they start no stop string, so what was streamed is always a prefix of the final text and
    the deltas join to exactly the non-streamed text.

    ``include_stop`` keeps the stop string that ended the text; ``skip_special_tokens=False``
    keeps special tokens' text; ``score_only`` (``max_tokens: 0``) drops the one token the rank
    generates: the choice reports the prompt's numbers and no output.
    """

    def __init__(
        self,
        index: int,
        prompt_token_ids: list[int],
        tokenizer: Tokenizer,
        stop_strings: list[str] | None = None,
        counts_prompt: bool = True,
        include_stop: bool = False,
        skip_special_tokens: bool = True,
        score_only: bool = False,
    ) -> None:
        self.index = index
        self.prompt_token_ids = prompt_token_ids
        # Whether usage counts this choice's prompt: the n choices of one prompt share one
        # prefill, and the prompt is counted once.
        self.counts_prompt = counts_prompt
        self.output_token_ids: list[int] = []
        self.text = ""  # sent so far (streamed, or collected for the body)
        self.finish_reason: str | None = None
        # The rank's count as of its last chunk (None until one arrives).
        self.usage: Usage | None = None
        # Per output token, when logprobs were asked for: the rank's logprobs and where the
        # token's text starts in ``text``.
        self.logprobs: list[TokenLogprobs] = []
        self.text_offsets: list[int] = []
        self.stopped = False  # a stop string ended it (the rank may still be generating)
        # Per prompt token from the second on, when prompt logprobs were asked for.
        self.prompt_logprobs: list[TokenLogprobs] | None = None
        self.include_stop = include_stop
        self.score_only = score_only
        self._detok = Detokenizer(tokenizer if skip_special_tokens else _KeepSpecial(tokenizer))
        self._stops = stop_strings or []
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""  # decoded, not yet sent

    def feed(self, chunk: GenerateChunk) -> Delta | None:
        """Take a chunk of this choice's tokens; the delta it makes (None: nothing to send)."""
        reason = chunk.finish_reason
        if chunk.prompt_logprobs is not None:
            self.prompt_logprobs = list(chunk.prompt_logprobs)
        if self.score_only:  # the rank's one token is not part of the answer
            return self._score_only(chunk)
        ids = list(chunk.token_ids)
        offsets = None
        if self._stops or chunk.logprobs is not None:
            # Token by token: the stop is found at the token that completes it (tokens after
            # it are dropped, as the rank's abort would), and each token's text offset is known.
            offsets = []
            for n, token in enumerate(ids):
                offsets.append(len(self.text) + len(self._pending))
                final = reason is not None and n == len(ids) - 1
                self._pending += self._detok.add([token], final=final)
                # Sent text never holds the start of a stop string (it would have been found
                # while the held-back tail was searched): only the unsent text is searched.
                found = first_stop(self._pending, self._stops)
                if found is not None:
                    cut = found[1] if self.include_stop else found[0]
                    self._pending, reason = self._pending[:cut], "stop"
                    del ids[n + 1 :], offsets[n + 1 :]
                    self.stopped = True
                    break
        else:
            self._pending += self._detok.add(ids, final=reason is not None)
        logprobs = None if chunk.logprobs is None else list(chunk.logprobs[: len(ids)])
        dropped = len(chunk.token_ids) - len(ids)
        self.usage = Usage(
            prompt_tokens=chunk.usage.prompt_tokens,
            completion_tokens=chunk.usage.completion_tokens - dropped,
        )
        self.output_token_ids.extend(ids)
        if logprobs is not None and offsets is not None:
            self.logprobs.extend(logprobs)
            self.text_offsets.extend(offsets)
        pending = self._pending
        send = len(pending) if reason is not None else max(0, len(pending) - self._hold)
        text, self._pending = pending[:send], pending[send:]
        self.text += text
        if reason is not None:
            self.finish_reason = reason
        if text or reason is not None or ids:
            return Delta(self.index, text, ids, reason, logprobs, offsets)
        return None

    def _score_only(self, chunk: GenerateChunk) -> Delta | None:
        """``max_tokens: 0``: the prompt's usage, no output, finished by ``length``."""
        self.usage = Usage(prompt_tokens=chunk.usage.prompt_tokens, completion_tokens=0)
        if chunk.finish_reason is None:
            return None
        self.finish_reason = "length" if chunk.finish_reason != "error" else "error"
        return Delta(self.index, "", [], self.finish_reason, None, None)


async def run_choices(
    stream: AsyncIterator[GenerateChunk], choices: list[Choice]
) -> AsyncIterator[Delta]:
    """Feed one rank stream's chunks (``chunk.index`` picks the choice) to its choices and
    yield the deltas they make.

    Leaving the stream early (every choice ended on a stop string) cancels it: the rank
    aborts what is still running.
    """
    ended = 0
    async for chunk in stream:
        if chunk.error is not None:
            raise RequestFailed(chunk.error, chunk.error_status)
        choice = choices[chunk.index]
        if chunk.prompt_logprobs is not None:  # one prefill: every choice of it reports them
            for other in choices:
                other.prompt_logprobs = list(chunk.prompt_logprobs)
        if choice.stopped:
            continue  # stopped here by a stop string; the rank's later tokens are dropped
        delta = choice.feed(chunk)
        if delta is not None:
            yield delta
        if choice.stopped or chunk.finish_reason is not None:
            ended += 1
            if ended == len(choices):
                return


def first_stop(text: str, stops: list[str]) -> tuple[int, int] | None:
    """``(start, end)`` of the stop string in ``text`` that completes first (as if the text
    arrived one character at a time), so the cut never depends on how it was chunked."""
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    if not hits:
        return None
    end, start = min(hits)
    return start, end


async def merge(streams: list[AsyncIterator[Delta]]) -> AsyncIterator[Delta]:
    """Interleave several choices' deltas as they come."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield item
        return
    queue: asyncio.Queue[Delta | BaseException | object] = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncIterator[Delta]) -> None:
        try:
            async for item in stream:
                await queue.put(item)
        except BaseException as exc:
            await queue.put(exc)
        finally:
            await queue.put(done)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()


def usage(choices: list[Choice]) -> dict[str, int]:
    """OpenAI's ``usage`` over the choices, from the ranks' counts (a choice that got no chunk
    counts its prompt and nothing generated; the n choices of one prompt count it once)."""
    prompt = completion = 0
    for c in choices:
        if c.usage is None:
            prompt += len(c.prompt_token_ids) if c.counts_prompt else 0
        else:
            prompt += c.usage.prompt_tokens if c.counts_prompt else 0
            completion += c.usage.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def token_ids_of(choice: Choice, return_token_ids: bool) -> dict[str, list[int] | None]:
    """The ids a choice's body carries: its prompt's and its own when the request asked for
    them (``return_token_ids``), else ``null`` (vLLM's choices always carry both keys)."""
    if not return_token_ids:
        return {"prompt_token_ids": None, "token_ids": None}
    return {"prompt_token_ids": choice.prompt_token_ids, "token_ids": choice.output_token_ids}
