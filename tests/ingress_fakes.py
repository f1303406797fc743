"""Fake rank handles and ingress builders shared by the ingress tests (no Ray)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from starlette.requests import Request

from roundgate.actors.control.messages import GenerateChunk, GenerateRequest, Usage
from roundgate.actors.control.request import TokenLogprobs
from roundgate.actors.role import DisaggregationRole
from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.completions import prompt_ids
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.protocol import CompletionRequest, parse
from roundgate.deployment.resume import ResumePolicy

FUSED = DisaggregationRole.FUSED

APP_ARGS = {"model": "tiny-moe", "dp_size": 2, "max_num_seqs": 4, "device": "cpu"}
CONTEXT = 4096  # tiny-moe's max_position


class FakeStream:
    """What ``handle.options(stream=True).generate.remote`` returns: chunks, then the end."""

    def __init__(self, chunks: list[Any]) -> None:
        self.chunks = chunks
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[GenerateChunk]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[GenerateChunk]:
        for chunk in self.chunks:
            await asyncio.sleep(0)
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk

    def cancel(self) -> None:
        self.cancelled = True


class FakeRanks:
    """A rank handle whose ``generate`` answers from ``reply(message) -> chunks``."""

    def __init__(self, reply: Callable[[GenerateRequest], list[Any]]) -> None:
        self.reply = reply
        self.payloads: list[GenerateRequest] = []
        self.streams: list[FakeStream] = []

    def options(self, **_: Any) -> FakeRanks:
        return self

    @property
    def generate(self) -> FakeRanks:
        return self

    def remote(self, message: GenerateRequest) -> FakeStream:
        assert isinstance(message, GenerateRequest)
        self.payloads.append(message)
        self.streams.append(FakeStream(self.reply(message)))
        return self.streams[-1]


def tokens(*ids: int, finish: str | None = None, prompt: int = 1, done: int = 0) -> GenerateChunk:
    """A rank's chunk: ``ids`` after ``done`` earlier tokens of a ``prompt``-token sequence."""
    return GenerateChunk(
        token_ids=tuple(ids),
        finish_reason=finish,
        usage=Usage(prompt_tokens=prompt, completion_tokens=done + len(ids)),
    )


def echo_reply(message: GenerateRequest) -> list[Any]:
    """Greets back with the prompt's first byte, then ``max_tokens - 1`` more 'a's."""
    n = message.sampling.max_tokens
    first, prompt = message.prompt_token_ids[0], len(message.prompt_token_ids)
    return [
        tokens(first, prompt=prompt),
        *[tokens(97, prompt=prompt, done=i) for i in range(1, n - 1)],
        tokens(97, finish="length", prompt=prompt, done=n - 1),
    ]


def make_ingress(reply: Callable = echo_reply, **args: Any) -> tuple[Ingress, FakeRanks]:
    ranks = FakeRanks(reply)
    return Ingress({**APP_ARGS, **args}, {FUSED: ranks}), ranks


def make_request(body: bytes, headers: dict[str, str] | None = None) -> Request:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": raw}
    return Request(scope, receive)


def complete(core: Ingress, request_id: str = "req-1", **body: Any) -> tuple[list, list]:
    """Run a completion through the ingress: (choices, deltas)."""

    async def run() -> tuple[list, list]:
        req = parse(CompletionRequest, body)
        prompts = prompt_ids(req, core.tokenizer)
        choices, stream = core.generate_each(request_id, prompts, req, req.max_tokens, "prompt")
        return choices, [d async for d in stream]

    return asyncio.run(run())


def error_of(fn: Callable[[], Any]) -> APIError:
    with pytest.raises(APIError) as info:
        fn()
    return info.value


# ---- a rank that follows the continuation contract, and ranks that die (tests/test_resume*) --


def model_token(context: Sequence[int], index: int, seed: int | None) -> int:
    """A stand-in model: greedy tokens depend on the whole context (prompt, resumed tokens and
    output), seeded ones on ``(seed, output index)`` only, as the real sampler's do. Letters
    and spaces, so text and stop strings are easy to read."""
    if seed is None:
        value = sum((i + 1) * t for i, t in enumerate(context[-4:])) + len(context)
    else:
        value = (seed * 2654435761 + index * 40503) >> 3
    letter = value % 27
    return 32 if letter == 26 else 97 + letter


def model_reply(message: GenerateRequest) -> list[Any]:
    """What a rank streams for ``message``: one token a chunk, the ``n`` sequences interleaved
    (each seeded per ``for_sequence``), honouring ``num_resumed_tokens`` (the output index and
    ``max_tokens`` count the resumed tokens), stop token ids, logprobs and prompt logprobs."""
    prompt = list(message.prompt_token_ids)
    sampling, resumed = message.sampling, message.num_resumed_tokens
    sequences: list[list[GenerateChunk]] = []
    for j in range(sampling.n):
        seq = sampling.for_sequence(j)
        out: list[int] = []
        chunks: list[GenerateChunk] = []
        sequences.append(chunks)
        while True:
            index = resumed + len(out)
            token = model_token(prompt + out, index, seq.seed)
            out.append(token)
            stop = token in seq.stop_token_ids
            finish = "stop" if stop else "length" if index + 1 >= seq.max_tokens else None
            logprobs = None
            if seq.logprobs is not None:  # the output position in the value: offsets are checkable
                logprobs = (TokenLogprobs(-float(index), (token,), (-float(index),)),)
            first_prompt = sampling.prompt_logprobs is not None and j == 0 and len(out) == 1
            prompt_lps = (
                tuple(TokenLogprobs(-1.0, (t,), (-1.0,)) for t in prompt[1:])
                if first_prompt
                else None
            )
            chunks.append(
                GenerateChunk(
                    token_ids=(token,),
                    finish_reason=finish,
                    usage=Usage(prompt_tokens=len(prompt), completion_tokens=len(out)),
                    logprobs=logprobs,
                    index=j,
                    prompt_logprobs=prompt_lps,
                )
            )
            if finish is not None:
                break
    longest = max(len(c) for c in sequences)
    return [c[i] for i in range(longest) for c in sequences if i < len(c)]


class Hang:
    """A chunk that never comes: the stream waits until it is cancelled (a pinned call that
    waits for a rank which never comes back)."""


class DyingRanks(FakeRanks):
    """``model_reply``'s ranks, attempt ``i`` cut after ``deaths[i] = (chunks, error)``: that
    many chunks, then ``error`` raised (or ``Hang()``: nothing more); attempts past
    ``deaths`` run to their end."""

    def __init__(self, *deaths: tuple[int, BaseException | Hang]) -> None:
        self.deaths = list(deaths)
        super().__init__(self._reply)

    def _reply(self, message: GenerateRequest) -> list[Any]:
        chunks = model_reply(message)
        attempt = len(self.payloads) - 1
        if attempt >= len(self.deaths):
            return chunks
        cut, error = self.deaths[attempt]
        return [*chunks[:cut], error]

    def remote(self, message: GenerateRequest) -> FakeStream:
        self.payloads.append(message)
        stream = HangingStream(self._reply(message))
        self.streams.append(stream)
        return stream


class HangingStream(FakeStream):
    """A ``FakeStream`` that waits forever at a ``Hang`` (until cancelled by its reader)."""

    async def _iter(self) -> AsyncIterator[GenerateChunk]:
        for chunk in self.chunks:
            await asyncio.sleep(0)
            if isinstance(chunk, Hang):
                await asyncio.Event().wait()
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk


def dying_ingress(
    *deaths: tuple[int, BaseException | Hang], **args: Any
) -> tuple[Ingress, DyingRanks]:
    """An ingress over ``DyingRanks(*deaths)`` that resubmits without waiting."""
    ranks = DyingRanks(*deaths)
    core = Ingress({**APP_ARGS, **args}, {FUSED: ranks})
    core.resume_policy = ResumePolicy(first_backoff_s=0, max_backoff_s=0)
    return core, ranks
