"""The Responses API's memory for ``previous_response_id``: each stored response's conversation,
bounded, in this ingress replica's process.

A follow-up request names an earlier response instead of resending the conversation; the
server renders the earlier turns from here. The store is deliberately small and local:

- at most ``max_entries`` responses; past that the least recently used is dropped (a
  ``previous_response_id`` naming it gets a 404 that names the id);
- one per ingress replica and never persisted: with ``ingress_replicas > 1`` a follow-up may
  reach a replica that never saw the first response (a 404 too), and a restart forgets all.

Clients that need durable conversations resend the history in ``input`` (what every client
does for chat completions).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_STORED_RESPONSES = 1024


@dataclass(frozen=True)
class StoredResponse:
    """What a follow-up needs: the conversation (chat messages, the response's own output
    last) without its ``instructions``, which OpenAI does not carry over to a follow-up."""

    messages: tuple[dict[str, Any], ...]


class ResponseStore:
    """Response id -> ``StoredResponse``, least recently used dropped past ``max_entries``."""

    def __init__(self, max_entries: int = MAX_STORED_RESPONSES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._entries[response_id] = stored
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (now the most recently used), or None when it is not here."""
        stored = self._entries.get(response_id)
        if stored is not None:
            self._entries.move_to_end(response_id)
        return stored
