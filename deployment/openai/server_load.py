"""vLLM's server load tracking (``--enable-server-load-tracking``, always on here): how many
generation requests this ingress replica is serving, read at ``GET /load``.

A request counts from the moment its route starts until its answer is complete: a JSON answer
when it returns, a stream when its last event has been sent or the client went away. Load
balancers read it to send work to the least busy replica; with several ingress replicas each
answers for itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask


class ServerLoad:
    """The in-flight count; ``track`` wraps one route call."""

    def __init__(self) -> None:
        self.num_requests = 0

    def snapshot(self) -> dict[str, int]:
        """``GET /load``'s body, in vLLM's shape."""
        return {"server_load": self.num_requests}

    async def track(self, answer: Awaitable[Any]) -> Any:
        """``answer`` (a route's coroutine) counted while it runs, and a streamed answer until
        its stream ends (the body's own ``finally``, or the response's background task when
        the stream never started: whichever comes first releases it, once)."""
        self.num_requests += 1
        try:
            out = await answer
        except BaseException:
            self.num_requests -= 1
            raise
        if not isinstance(out, StreamingResponse):
            self.num_requests -= 1
            return out
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.num_requests -= 1

        body = out.body_iterator

        async def counted() -> AsyncIterator[Any]:
            try:
                async for part in body:
                    yield part
            finally:
                release()

        previous = out.background  # kept: a route's own background task still runs

        async def after() -> None:
            release()
            if previous is not None:
                await previous()

        out.body_iterator = counted()
        out.background = BackgroundTask(after)
        return out
