"""Server-sent events: a request's deltas streamed as OpenAI stream chunks, then ``[DONE]``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from roundgate.deployment.openai.choices import Choice, Delta, usage
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.protocol import StreamOptions


def sse(obj: dict[str, Any]) -> str:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def drain(deltas: AsyncIterator[Delta]) -> None:
    """Run a non-streamed request to its end (its choices collect the text)."""
    async for _ in deltas:
        pass


def stream(
    deltas: AsyncIterator[Delta],
    chunk: Callable[[Delta], dict[str, Any]],
    head: dict[str, Any],
    choices: list[Choice],
    options: StreamOptions | None,
) -> StreamingResponse:
    """``chunk(delta)`` per delta as one event; with ``include_usage`` a last chunk of usage,
    and with ``continuous_usage_stats`` too every chunk carries the usage so far (vLLM)."""
    include_usage = options is not None and options.include_usage
    continuous = include_usage and options is not None and options.continuous_usage_stats

    async def body() -> AsyncIterator[str]:
        try:
            async for d in deltas:
                event = chunk(d)
                if continuous:
                    event["usage"] = usage(choices)
                yield sse(event)
        except APIError as exc:
            # Headers are already sent: the error travels as a final event.
            yield sse(exc.body())
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage(choices)})
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")
