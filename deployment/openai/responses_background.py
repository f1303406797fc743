"""Background responses and the stored-response routes: ``background: true`` answers at once
with a ``queued`` response and runs it as a task of this ingress replica;
``GET /v1/responses/{id}`` reads a stored response, ``POST .../cancel`` stops a background
one, ``DELETE`` forgets one — through any ingress replica, since the store is shared
(``roundgate.deployment.openai.stored_responses``).

As vLLM's, a background response reads ``queued`` until it ends (``completed``,
``incomplete``, ``failed`` or ``cancelled``). The task runs on the replica that accepted it
(its ``owner``), which holds a lease on it in the store and renews it every ``RENEW_S`` while
it runs. A cancel or delete, on any replica, is written to the store at once (the response
reads ``cancelled`` from then on); the owner learns it at its next renewal and cancels the
task, and with it the rank request (the stream's ``finally`` cancels the rank's generator).
On the owner itself the task is cancelled before the route answers. An owner that dies stops
renewing: past its lease the store answers the response ``failed``, code ``ingress_lost``
(not resumed elsewhere: its rank request died with the replica's handle to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.response_body import ResponseBody
from roundgate.deployment.openai.response_store import (
    BACKGROUND_TIMEOUT_S,
    MAX_BACKGROUND,
    StoredResponse,
)
from roundgate.deployment.openai.stored_responses import StoredResponses

RENEW_S = 0.25
logger = logging.getLogger(__name__)


class BackgroundResponses:
    """This replica's background responses: their tasks, bounded in number (``max_background``,
    per replica) and in time (``timeout_s``), and the lease renewal that tells the store they
    run and learns which were cancelled elsewhere."""

    def __init__(
        self,
        store: StoredResponses,
        max_background: int = MAX_BACKGROUND,
        timeout_s: float = BACKGROUND_TIMEOUT_S,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.max_background = max_background
        self.timeout_s = timeout_s
        self.owner = owner or f"ingress-{uuid.uuid4().hex[:12]}"
        self.tasks: dict[str, asyncio.Task[None]] = {}  # response id -> its task
        self._renewal: asyncio.Task[None] | None = None

    def check_room(self) -> None:
        """A 429 naming the limit when this replica runs ``max_background`` background
        responses already (checked before the request's prompt is rendered or its rank
        request made)."""
        if len(self.tasks) >= self.max_background:
            raise APIError(
                429,
                f"this server runs {len(self.tasks)} background responses, its limit "
                f"(max_background_responses {self.max_background}); retry when one has "
                "ended, or cancel one",
                param="background",
                code="too_many_background_responses",
            )

    async def start(
        self, body: ResponseBody, finish: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Store the response as ``queued`` (leased to this replica), start ``finish`` (which
        stores the final response) as a task, and return the queued response."""
        response_id = body.response_id
        queued = body("queued")
        await self.store.put(
            response_id, StoredResponse(body=queued, background=True, owner=self.owner)
        )

        async def end(status: str, error: dict[str, Any] | None = None) -> None:
            # Ignored by the store when the response was cancelled or deleted meanwhile.
            ended = StoredResponse(body=body(status, error), background=True)
            with contextlib.suppress(APIError):  # the store away: its lease will expire
                await self.store.finish(response_id, ended)

        async def run() -> None:
            try:
                await asyncio.wait_for(finish(), self.timeout_s)
            except TimeoutError:  # its rank request is cancelled with ``finish``
                await end(
                    "failed",
                    {
                        "code": "background_timeout",
                        "message": "the response ran past background_timeout_s "
                        f"({self.timeout_s:g} s)",
                    },
                )
            except APIError as exc:
                await end("failed", {"code": exc.code or exc.type, "message": exc.message})
            except asyncio.CancelledError:
                await end("cancelled")
                raise
            except Exception as exc:  # logged; the client polls a failed response, not a hang
                logger.exception("background response %s failed", response_id)
                await end(
                    "failed", {"code": "server_error", "message": f"the response failed: {exc!r}"}
                )
            finally:
                if self.tasks.get(response_id) is asyncio.current_task():
                    del self.tasks[response_id]

        self.tasks[response_id] = asyncio.get_running_loop().create_task(run())
        if self._renewal is None or self._renewal.done():
            self._renewal = asyncio.get_running_loop().create_task(self._renew())
        return queued

    async def stop(self, response_id: str) -> None:
        """Cancel this replica's task of ``response_id``, if it runs here, and wait for it."""
        task = self.tasks.pop(response_id, None)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # a cancel of the caller itself still raises

    async def _renew(self) -> None:
        """While tasks run: renew their leases; stop those the store says are over."""
        while self.tasks:
            await asyncio.sleep(RENEW_S)
            try:
                over = await self.store.renew(self.owner, list(self.tasks))
            except APIError as exc:  # the store away: retried at the next tick
                logger.warning("background responses' lease renewal failed: %s", exc.message)
                continue
            for response_id in over:
                task = self.tasks.pop(response_id, None)
                if task is not None:
                    task.cancel()


def _not_found(response_id: str) -> APIError:
    return APIError(
        404,
        f"Response with id '{response_id}' not found.",
        param="response_id",
        code="response_not_found",
    )


async def retrieve_response(
    store: StoredResponses, response_id: str, stream: str | None = None
) -> dict[str, Any]:
    """``GET /v1/responses/{id}``: the stored response as it stands. ``stream``: the query
    parameter as sent; anything but absent or false asks for events, which are refused."""
    if stream is not None and stream.strip().lower() not in ("", "false", "0"):
        raise APIError(
            400,
            "stream: retrieving a response as events is not supported by roundgate; "
            "GET it without stream",
            param="stream",
        )
    stored = await store.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored.body


async def cancel_response(
    store: StoredResponses, background: BackgroundResponses, response_id: str
) -> dict[str, Any]:
    """``POST /v1/responses/{id}/cancel``: stop a background response that has not ended
    (vLLM's words for any other). The store marks it cancelled; its task stops here at once
    when this replica runs it, else at its owner's next renewal."""
    stored, cancelled = await store.cancel(response_id)
    if stored is None:
        raise _not_found(response_id)
    if not cancelled:
        raise APIError(400, "Cannot cancel a synchronous response.", param="response_id")
    await background.stop(response_id)
    return stored.body


async def delete_response(
    store: StoredResponses, background: BackgroundResponses, response_id: str
) -> dict[str, Any]:
    """``DELETE /v1/responses/{id}``: forget a response (a running one is cancelled)."""
    if not await store.delete(response_id):
        raise _not_found(response_id)
    await background.stop(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}
