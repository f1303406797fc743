"""The Responses API's memory: each stored response's object (for ``GET /v1/responses/{id}``)
and conversation (for ``previous_response_id``), bounded, in this ingress replica's process.

A follow-up request names an earlier response instead of resending the conversation; the
server renders the earlier turns from here. A ``background`` response lives here while it
runs, so a client can poll it and cancel it. The store is deliberately small and local:

- at most ``max_entries`` responses; past that the least recently used finished one is
  dropped (an id naming it gets a 404 that names the id). A response still queued or running
  is never dropped: its client is polling it;
- one per ingress replica and never persisted: with ``ingress_replicas > 1`` a follow-up may
  reach a replica that never saw the first response (a 404 too), and a restart forgets all.

Clients that need durable conversations resend the history in ``input`` (what every client
does for chat completions).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

MAX_STORED_RESPONSES = 1024
MAX_BACKGROUND = 100
BACKGROUND_TIMEOUT_S = 3600.0
UNFINISHED = ("queued", "in_progress")


@dataclass
class StoredResponse:
    """A response as the store keeps it.

    ``messages``: the conversation for a follow-up (chat messages, the response's own output
    last) without its ``instructions``, which OpenAI does not carry over; empty until the
    response is done. ``body``: the response object as it stands (its ``status`` moves from
    ``queued`` on while a background response runs). ``background``: whether it was created
    with ``background: true`` (only those can be cancelled)."""

    messages: tuple[dict[str, Any], ...] = ()
    body: dict[str, Any] = field(default_factory=dict)
    background: bool = False

    @property
    def status(self) -> str | None:
        return self.body.get("status")

    @property
    def finished(self) -> bool:
        return self.status not in UNFINISHED


class ResponseStore:
    """Response id -> ``StoredResponse``; the least recently used finished one dropped past
    ``max_entries``."""

    def __init__(
        self,
        max_entries: int = MAX_STORED_RESPONSES,
        max_background: int = MAX_BACKGROUND,
        background_timeout_s: float = BACKGROUND_TIMEOUT_S,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        # Background responses run as this replica's tasks, outside Serve's request count:
        # bounded here (``max_background_responses``) and in time (``background_timeout_s``).
        self.max_background = max_background
        self.background_timeout_s = background_timeout_s
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        # Background responses still running: id -> their task (for cancel).
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._entries[response_id] = stored
        self._entries.move_to_end(response_id)
        excess = len(self._entries) - self.max_entries
        if excess > 0:
            oldest = [k for k, v in self._entries.items() if v.finished and k != response_id]
            for key in oldest[:excess]:
                del self._entries[key]

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (now the most recently used), or None when it is not here."""
        stored = self._entries.get(response_id)
        if stored is not None:
            self._entries.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        """Forget a response; whether it was here."""
        return self._entries.pop(response_id, None) is not None
