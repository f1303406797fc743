"""Background responses and the stored-response routes: ``background: true`` answers at once
with a ``queued`` response and runs it as a task of this ingress replica;
``GET /v1/responses/{id}`` reads a stored response, ``POST .../cancel`` stops a background
one, ``DELETE`` forgets one.

As vLLM's, a background response reads ``queued`` until it ends (``completed``,
``incomplete``, ``failed`` or ``cancelled``). Cancelling cancels the task, and with it the
rank request (the stream's ``finally`` cancels the rank's generator), so a cancelled
response stops using the group. The task and the response live in this replica's
``ResponseStore``: another replica, or this one after a restart, answers 404.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.response_body import ResponseBody
from roundgate.deployment.openai.response_store import ResponseStore, StoredResponse

logger = logging.getLogger(__name__)


def check_background_room(store: ResponseStore) -> None:
    """A 429 naming the limit when this replica runs ``max_background`` background responses
    already (checked before the request's prompt is rendered or its rank request made)."""
    if len(store.tasks) >= store.max_background:
        raise APIError(
            429,
            f"this server runs {len(store.tasks)} background responses, its limit "
            f"(max_background_responses {store.max_background}); retry when one has ended, "
            "or cancel one",
            param="background",
            code="too_many_background_responses",
        )


def run_in_background(
    store: ResponseStore,
    body: ResponseBody,
    finish: Callable[[], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """Store the response as ``queued``, start ``finish`` (which stores the final response)
    as a task, and return the queued response."""
    response_id = body.response_id
    queued = body("queued")
    store.put(response_id, StoredResponse(body=queued, background=True))

    def end(status: str, error: dict[str, Any] | None = None) -> None:
        # Not after a DELETE, which took the task out of ``store.tasks`` first.
        if store.tasks.get(response_id) is asyncio.current_task():
            store.put(response_id, StoredResponse(body=body(status, error), background=True))

    async def run() -> None:
        try:
            await asyncio.wait_for(finish(), store.background_timeout_s)
        except TimeoutError:  # its rank request is cancelled with ``finish``
            end(
                "failed",
                {
                    "code": "background_timeout",
                    "message": f"the response ran past background_timeout_s "
                    f"({store.background_timeout_s:g} s)",
                },
            )
        except APIError as exc:
            end("failed", {"code": exc.code or exc.type, "message": exc.message})
        except asyncio.CancelledError:
            end("cancelled")
            raise
        except Exception as exc:  # logged; the client polls a failed response, not a hang
            logger.exception("background response %s failed", response_id)
            end("failed", {"code": "server_error", "message": f"the response failed: {exc!r}"})
        finally:
            if store.tasks.get(response_id) is asyncio.current_task():
                del store.tasks[response_id]

    store.tasks[response_id] = asyncio.get_running_loop().create_task(run())
    return queued


def _stored(store: ResponseStore, response_id: str) -> StoredResponse:
    stored = store.get(response_id)
    if stored is None:
        raise APIError(
            404,
            f"Response with id '{response_id}' not found.",
            param="response_id",
            code="response_not_found",
        )
    return stored


def retrieve_response(
    store: ResponseStore, response_id: str, stream: str | None = None
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
    return _stored(store, response_id).body


async def cancel_response(store: ResponseStore, response_id: str) -> dict[str, Any]:
    """``POST /v1/responses/{id}/cancel``: stop a background response that has not ended
    (vLLM's words for any other)."""
    stored = _stored(store, response_id)
    task = store.tasks.get(response_id)
    if not stored.background or task is None or stored.finished:
        raise APIError(400, "Cannot cancel a synchronous response.", param="response_id")
    task.cancel()
    await asyncio.wait([task])  # its end stored; a cancel of this route itself still raises
    return _stored(store, response_id).body


def delete_response(store: ResponseStore, response_id: str) -> dict[str, Any]:
    """``DELETE /v1/responses/{id}``: forget a response (a running one is cancelled)."""
    _stored(store, response_id)
    task = store.tasks.pop(response_id, None)
    if task is not None:
        task.cancel()
    store.delete(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}
