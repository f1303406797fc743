"""Running several choices of one HTTP request at once, and what they add up to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from deployment.generation import Choice, Delta


async def merge(streams: list[AsyncIterator[Delta]]) -> AsyncIterator[Delta]:
    """Interleave several choices' deltas as they come."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
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
