"""One request's token events (every sequence of it, for ``n > 1``) as ``GenerateChunk``s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from roundgate.actors.control.messages import GenerateChunk, Usage
from roundgate.actors.control.request import Request, sequence_id
from roundgate.actors.control.round import TokenEvent


class ChunkBuilder:
    """Collects events and hands out chunks of at least ``stream_interval`` tokens per
    sequence (or fewer, when the sequence ends); a sequence's chunks carry its ``index``."""

    def __init__(self, request: Request, stream_interval: int) -> None:
        self.request = request
        self.n = request.sampling.n
        self.interval = stream_interval
        self.wants_logprobs = request.sampling.logprobs is not None
        self.wants_prompt_logprobs = request.sampling.prompt_logprobs is not None
        self.sequences: dict[int, Request] = {0: request}
        self.pending: dict[int, list[int]] = {}
        self.sent: dict[int, int] = {}  # tokens streamed per sequence
        self.finished: dict[int, str | None] = {}
        self.reported: set[int] = set()

    @property
    def done(self) -> bool:
        return len(self.reported) == self.n

    def add(self, event: TokenEvent) -> None:
        seq = event.request
        index = seq.index
        self.sequences[index] = seq
        if event.token_id is not None:
            self.pending.setdefault(index, []).append(event.token_id)
        if event.finished:
            self.finished[index] = seq.finish_reason

    def take(self) -> list[GenerateChunk]:
        """The chunks ready now: a sequence's pending tokens once enough, or its end."""
        out = []
        for index in sorted(set(self.pending) | (self.finished.keys() - self.reported)):
            tokens = self.pending.get(index, [])
            reason = self.finished.get(index)
            if index not in self.finished and len(tokens) < self.interval:
                continue
            seq = self.sequences[index]
            sent = self.sent.get(index, 0)
            logprobs = None
            if self.wants_logprobs:
                # The scheduler appends a token's logprobs before its event is sent.
                logprobs = tuple(seq.output_logprobs[sent : sent + len(tokens)])
            self.sent[index] = sent + len(tokens)
            usage = Usage(prompt_tokens=seq.num_prompt_tokens, completion_tokens=sent + len(tokens))
            if seq.error is not None:  # it failed alone: the rank and the group are fine
                out.append(
                    GenerateChunk(
                        token_ids=tuple(tokens),
                        finish_reason="error",
                        usage=usage,
                        error=seq.error,
                        logprobs=None,
                        index=index,
                        error_status=500,
                    )
                )
            else:
                prompt = None
                if self.wants_prompt_logprobs and index == 0 and sent == 0:
                    prompt = tuple(seq.prompt_logprobs)  # the prefill ended before any token
                out.append(
                    GenerateChunk(
                        token_ids=tuple(tokens),
                        finish_reason=reason,
                        usage=usage,
                        error=None,
                        logprobs=logprobs,
                        index=index,
                        error_status=400,
                        prompt_logprobs=prompt,
                    )
                )
            self.pending.pop(index, None)
            if index in self.finished:
                self.reported.add(index)
        return out

    def unfinished_ids(self) -> list[str]:
        """Scheduler ids of the sequences that have not finished (to abort them)."""
        rid = self.request.request_id
        return [
            rid if j == 0 else sequence_id(rid, j) for j in range(self.n) if j not in self.finished
        ]


async def relay(
    builder: ChunkBuilder, queue: asyncio.Queue, until: type | None = None
) -> AsyncIterator[Any]:
    """The request's events from ``queue`` as chunks, until every sequence ended (or an item
    of type ``until`` arrives: yielded as it is, and the relay stops). An exception in the
    queue (the group failed) is raised."""
    while not builder.done:
        # Whatever queued up while we were away goes out in one chunk: under load that
        # batches tokens; ``stream_interval`` sets the minimum chunk size.
        items = [await queue.get()]
        while not queue.empty():
            items.append(queue.get_nowait())
        for item in items:
            if isinstance(item, BaseException):
                raise item
            if until is not None and isinstance(item, until):
                for chunk in builder.take():
                    yield chunk
                yield item
                return
            builder.add(item)
        for chunk in builder.take():
            yield chunk
