"""How long a prefill rank keeps a handoff's pages pinned when no decode rank asks for them.

A handoff's pages stay pinned on its prefill rank until a decode rank's ``send_kv`` (or the
ingress's ``release_handoff``) ends its transfer. Both come from the ingress that holds the
request: if that ingress dies between the prefill's answer and the decode rank's call, or the
decode rank dies with the handoff queued and the ingress with it, nobody ever ends the
transfer and the pages would stay pinned for the life of the rank, counted in its pool's
occupancy, until the rank stops admitting prompts. vLLM's NIXL connector bounds the same wait
on its producer side (``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``, 480 s); so does this, with
``--handoff-timeout-s``.

Pure bookkeeping with the clock passed in: the prefill role reads the clock and releases what
``expired`` returns.
"""

from __future__ import annotations

from collections import OrderedDict


class HandoffExpiry:
    """Handoffs still pinned, by id, each with the time its pin ends on its own."""

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"--handoff-timeout-s must be > 0, got {timeout_s!r}")
        self.timeout_s = timeout_s
        # id -> deadline; handoffs arrive in time order, so the first entry expires first.
        self._deadlines: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._deadlines)

    def pinned(self, request_id: str, now: float) -> None:
        """``request_id`` was handed off at ``now``: its pages are pinned from here."""
        self._deadlines.pop(request_id, None)
        self._deadlines[request_id] = now + self.timeout_s

    def ended(self, request_id: str) -> bool:
        """Its transfer began or ended (a decode rank asked, or it was released): nothing
        to expire. False when it was not on the clock (expired already, or never pinned)."""
        return self._deadlines.pop(request_id, None) is not None

    def expired(self, now: float) -> list[str]:
        """The handoffs whose deadline has passed at ``now`` (forgotten here: each is
        returned once)."""
        out: list[str] = []
        while self._deadlines:
            request_id, deadline = next(iter(self._deadlines.items()))
            if deadline > now:
                break
            del self._deadlines[request_id]
            out.append(request_id)
        return out

    def next_deadline(self) -> float | None:
        """When the earliest pin ends, or None with nothing pinned."""
        return next(iter(self._deadlines.values()), None)
