"""Fake rank handles and ingress builders shared by the ingress tests (no Ray)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from starlette.requests import Request

from actors.control.messages import GenerateChunk, GenerateRequest, Usage
from deployment.ingress import Ingress
from deployment.openai.completions import prompt_ids
from deployment.openai.errors import APIError
from deployment.openai.protocol import CompletionRequest, parse

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
    return Ingress(ranks, {**APP_ARGS, **args}), ranks


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
