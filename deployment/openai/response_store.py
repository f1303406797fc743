"""The Responses API's memory: each stored response's object (for ``GET /v1/responses/{id}``)
and conversation (for ``previous_response_id``), bounded; pure and synchronous.

A follow-up request names an earlier response instead of resending the conversation; the
server renders the earlier turns from here. A ``background`` response lives here while it
runs, so a client can poll it and cancel it through any ingress replica. One ``ResponseStore``
serves every ingress replica: it lives in a named actor on the head node
(``roundgate.deployment.response_store_actor``); the ingress reaches it through
``roundgate.deployment.openai.stored_responses``. This module is the table itself, with no
Ray, so its rules are tested alone:

- at most ``max_entries`` responses and ``max_total_bytes`` of them; past either the least
  recently used finished one is dropped (an id naming it gets a 404 that names the id);
- one response (its object and conversation, as JSON) is at most ``max_entry_bytes``: a
  larger conversation is not kept (continuing it is a 400 that says so), a larger object
  not at all. So no client fills the store with a few giant conversations;
- a response still queued or running is never dropped (its client polls it), but it is
  leased to the ingress replica running it (``owner``), which renews the lease while it
  runs (``renew``). Past its lease the owner is taken for dead: the response reads
  ``failed`` (code ``ingress_lost``) from then on, and can be dropped like any finished one.
  Unfinished responses are thus bounded by the replicas' ``max_background_responses`` and
  their lifetimes: no client keeps an entry forever.

Cancel and delete are requests on the table: the owner, renewing its leases, learns which
of its responses are over (cancelled, deleted, expired) and stops their rank requests.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

MAX_STORED_RESPONSES = 1024
MAX_ENTRY_BYTES = 2 << 20
MAX_TOTAL_BYTES = 256 << 20
LEASE_S = 10.0
MAX_BACKGROUND = 100
BACKGROUND_TIMEOUT_S = 3600.0
UNFINISHED = ("queued", "in_progress")
INGRESS_LOST = "ingress_lost"


@dataclass(frozen=True)
class StoredResponse:
    """A response as the store keeps it (and as it crosses to and from the store's actor).

    ``messages``: the conversation for a follow-up (chat messages, the response's own output
    last) without its ``instructions``, which OpenAI does not carry over; empty until the
    response is done. ``body``: the response object as it stands (its ``status`` moves from
    ``queued`` on while a background response runs). ``background``: whether it was created
    with ``background: true`` (only those can be cancelled). ``owner``: the ingress replica
    running it, while it runs. ``conversation_bytes``: set when the conversation was too
    large to keep (its size), so a follow-up is refused by name rather than as unknown."""

    messages: tuple[dict[str, Any], ...] = ()
    body: dict[str, Any] = field(default_factory=dict)
    background: bool = False
    owner: str | None = None
    conversation_bytes: int | None = None

    @property
    def status(self) -> str | None:
        return self.body.get("status")

    @property
    def finished(self) -> bool:
        return self.status not in UNFINISHED

    def ended(self, status: str, error: dict[str, Any] | None = None) -> StoredResponse:
        """This response ended by the store itself (cancelled, or its owner lost): the
        object as ``ResponseBody`` writes it at that status (no output, no usage)."""
        return replace(self, owner=None, body={**self.body, "status": status, "error": error})


def entry_bytes(stored: StoredResponse) -> int:
    """The size a response takes in the store: its object and conversation as JSON."""
    return len(json.dumps([stored.messages, stored.body], separators=(",", ":"), default=str))


class ResponseStore:
    """Response id -> ``StoredResponse``; the least recently used finished one dropped past
    ``max_entries`` or ``max_total_bytes``. ``clock``: wall seconds (leases outlive a restart
    of the store's actor, which reloads its snapshot); ``journal``: record changed ids for a
    snapshot (``take_changes``)."""

    def __init__(
        self,
        max_entries: int = MAX_STORED_RESPONSES,
        max_entry_bytes: int = MAX_ENTRY_BYTES,
        max_total_bytes: int = MAX_TOTAL_BYTES,
        lease_s: float = LEASE_S,
        clock: Callable[[], float] = time.time,
        journal: bool = False,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if not 0 < max_entry_bytes <= max_total_bytes:
            raise ValueError(
                f"max_entry_bytes must be in (0, max_total_bytes {max_total_bytes}], "
                f"got {max_entry_bytes}"
            )
        self.max_entries = max_entries
        self.max_entry_bytes = max_entry_bytes
        self.max_total_bytes = max_total_bytes
        self.lease_s = lease_s
        self.clock = clock
        self.total_bytes = 0
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes: dict[str, int] = {}
        self._leases: dict[str, float] = {}  # unfinished background id -> lease end
        self._changed: set[str] | None = set() if journal else None

    def __len__(self) -> int:
        return len(self._entries)

    # ---- reads ---------------------------------------------------------------------------

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (now the most recently used), or None when it is not here. A
        response whose owner's lease ran out reads ``failed`` (``ingress_lost``)."""
        self._expire(response_id)
        stored = self._entries.get(response_id)
        if stored is not None:
            self._entries.move_to_end(response_id)
        return stored

    def lease_of(self, response_id: str) -> float | None:
        return self._leases.get(response_id)

    # ---- writes --------------------------------------------------------------------------

    def put(self, response_id: str, stored: StoredResponse) -> bool:
        """Keep ``stored`` (its conversation dropped when too large); whether it was kept. An
        unfinished one with an ``owner`` is leased to it from now."""
        size = entry_bytes(stored)
        if size > self.max_entry_bytes and stored.messages:
            stored = replace(stored, messages=(), conversation_bytes=size)
            size = entry_bytes(stored)
        if size > self.max_entry_bytes:
            self.delete(response_id)  # an older version of it would be stale
            return False
        self._set(response_id, stored, size)
        if stored.owner is not None and not stored.finished:
            self._leases[response_id] = self.clock() + self.lease_s
        self._evict(keep=response_id)
        return True

    def finish(self, response_id: str, stored: StoredResponse) -> bool:
        """The owner's end of a background response; ignored (False) when the response was
        cancelled, deleted or given up on meanwhile: what a client was told stands."""
        self._expire(response_id)
        current = self._entries.get(response_id)
        if current is None or current.finished:
            return False
        return self.put(response_id, replace(stored, owner=None))

    def cancel(self, response_id: str) -> tuple[StoredResponse | None, bool]:
        """Cancel a background response that has not ended: (the response as it stands or
        None when unknown, whether this call cancelled it). Its owner learns it at its next
        ``renew`` and stops the rank request."""
        stored = self.get(response_id)
        if stored is None or not stored.background or stored.finished:
            return stored, False
        stored = stored.ended("cancelled")
        self._set(response_id, stored, entry_bytes(stored))
        return stored, True

    def delete(self, response_id: str) -> bool:
        """Forget a response (a running one's owner stops it at its next ``renew``)."""
        stored = self._entries.pop(response_id, None)
        if stored is None:
            return False
        self.total_bytes -= self._bytes.pop(response_id)
        self._leases.pop(response_id, None)
        self._note(response_id)
        return True

    def renew(self, owner: str, response_ids: list[str]) -> list[str]:
        """The owner's heartbeat over the background responses it runs: their leases
        renewed; the ids among them that are over (cancelled, deleted, given up on), which
        the owner must stop."""
        over: list[str] = []
        until = self.clock() + self.lease_s
        for response_id in response_ids:
            self._expire(response_id)
            stored = self._entries.get(response_id)
            if stored is None or stored.finished or stored.owner != owner:
                over.append(response_id)
            else:
                self._leases[response_id] = until
        return over

    def restore(self, response_id: str, stored: StoredResponse, lease: float | None) -> None:
        """Reload one snapshotted response (oldest first), its lease as it was."""
        self._set(response_id, stored, entry_bytes(stored))
        if lease is not None:
            self._leases[response_id] = lease
        self._evict(keep=response_id)

    def take_changes(self) -> tuple[dict[str, tuple[StoredResponse, float | None]], list[str]]:
        """The responses written and the ids dropped since the last call (journal only)."""
        if self._changed is None:
            raise ValueError("take_changes needs a store made with journal=True")
        changed, self._changed = self._changed, set()
        written = {
            i: (self._entries[i], self._leases.get(i)) for i in changed if i in self._entries
        }
        return written, sorted(changed - written.keys())

    # ---- the rules -----------------------------------------------------------------------

    def _set(self, response_id: str, stored: StoredResponse, size: int, touch: bool = True) -> None:
        self.total_bytes += size - self._bytes.get(response_id, 0)
        self._bytes[response_id] = size
        self._entries[response_id] = stored
        if touch:
            self._entries.move_to_end(response_id)
        if stored.finished:
            self._leases.pop(response_id, None)
        self._note(response_id)

    def _note(self, response_id: str) -> None:
        if self._changed is not None:
            self._changed.add(response_id)

    def _expire(self, response_id: str) -> None:
        """A response whose owner stopped renewing its lease: failed, naming the cause."""
        lease = self._leases.get(response_id)
        if lease is None or lease >= self.clock():
            return
        stored = self._entries[response_id].ended(
            "failed",
            {
                "code": INGRESS_LOST,
                "message": "the ingress replica running this background response stopped "
                f"(no heartbeat for {self.lease_s:g} s); create the response again",
            },
        )
        self._set(response_id, stored, entry_bytes(stored), touch=False)  # its LRU place kept

    def _evict(self, keep: str) -> None:
        def over() -> bool:
            return len(self._entries) > self.max_entries or self.total_bytes > self.max_total_bytes

        if not over():
            return
        for response_id in list(self._leases):
            self._expire(response_id)
        for response_id in [k for k, v in self._entries.items() if v.finished and k != keep]:
            if not over():
                break
            self.delete(response_id)
