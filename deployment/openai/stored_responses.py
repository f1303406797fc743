"""The ingress's door to the Responses store: the table's calls, awaited, on the store every
ingress replica shares (its actor, ``roundgate.deployment.response_store_actor``) or, without
Ray (the ingress's own tests), on a ``ResponseStore`` in this process.

A call to the actor has ``timeout_s``; an actor that does not answer in time, or is gone,
is a 503 naming the store (code ``response_store_unavailable``, with ``Retry-After``): never
a hang, never a bare 500. Ray restarts the actor, and it reloads its snapshot.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.response_store import ResponseStore, StoredResponse

if TYPE_CHECKING:
    from ray.actor import ActorHandle

STORE_TIMEOUT_S = 5.0
RETRY_AFTER_S = 2


class StoredResponses:
    """``ResponseStore``'s calls, awaited: on ``actor`` when given, else on ``local``."""

    def __init__(
        self,
        local: ResponseStore | None = None,
        actor: ActorHandle | None = None,
        timeout_s: float = STORE_TIMEOUT_S,
    ) -> None:
        self.local = local if local is not None or actor is not None else ResponseStore()
        self.actor = actor
        self.timeout_s = timeout_s

    @property
    def is_shared(self) -> bool:
        return self.actor is not None

    async def get(self, response_id: str) -> StoredResponse | None:
        return await self._call("get", response_id)

    async def put(self, response_id: str, stored: StoredResponse) -> bool:
        return await self._call("put", response_id, stored)

    async def finish(self, response_id: str, stored: StoredResponse) -> bool:
        return await self._call("finish", response_id, stored)

    async def cancel(self, response_id: str) -> tuple[StoredResponse | None, bool]:
        return await self._call("cancel", response_id)

    async def delete(self, response_id: str) -> bool:
        return await self._call("delete", response_id)

    async def renew(self, owner: str, response_ids: list[str]) -> list[str]:
        return await self._call("renew", owner, response_ids)

    async def _call(self, method: str, *args: Any) -> Any:
        if self.actor is None:
            return getattr(self.local, method)(*args)
        from ray.exceptions import RayError

        try:
            ref = getattr(self.actor, method).remote(*args)
            return await asyncio.wait_for(ref, self.timeout_s)
        except (TimeoutError, RayError) as exc:
            why = "did not answer in time" if isinstance(exc, TimeoutError) else "is unreachable"
            raise APIError(
                503,
                f"the Responses store (the {method} call to its actor) {why}; retry shortly",
                code="response_store_unavailable",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
