"""The round's gather for an elastic group: a failed collective re-forms the group instead of
ending it, and a joiner is admitted at a round boundary every member agrees on.

``ElasticGather`` wraps the process group's gather. Each row carries one more column, set when
this member saw a joiner waiting for the next epoch (it looks every ``poll_s``, off the round's
path otherwise); the gathered rows are the same on every member, so if any row has it set,
every member moves to the next epoch after the same round. When the collective itself fails
(a peer's connections reset, or it timed out), the members that are left move to the next
epoch without it (``membership.next_epoch``). Either way the row is gathered again in the new
group, and ``on_reform`` lets the rank reset what depends on the group (the gate's counter
restarts; a group of one gathers its own row).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from roundgate.actors.control.gather import Gather, Packed, SingleRankGather
from roundgate.actors.replica.epoch_group import form_group
from roundgate.actors.replica.membership import (
    Epoch,
    Fenced,
    MembershipStore,
    joiners,
    next_epoch,
)

# Re-forms one gather may go through before giving up (a member failing again mid re-form).
MAX_REFORMS = 4


class ElasticGather:
    """``Gather`` over the current epoch's process group, re-forming on a fault or a joiner."""

    def __init__(
        self,
        store: MembershipStore,
        epoch: Epoch,
        backend: str,
        timeout_s: float,
        window_s: float,
        make_gather: Callable[[], Gather],
        on_reform: Callable[[Epoch, str], None] = lambda epoch, reason: None,
        poll_s: float = 1.0,
        host: str | None = None,
        on_poll: Callable[[], None] = lambda: None,
        meeting: Any = None,
    ) -> None:
        self.store = store
        self.epoch = epoch
        self.backend = backend
        self.timeout_s = timeout_s
        self.window_s = window_s
        self.make_gather = make_gather
        self.on_reform = on_reform
        self.poll_s = poll_s
        self.host = host
        self.on_poll = on_poll  # e.g. the member's heartbeat, at the poll's pace
        self.meeting = meeting  # where the current epoch's group met (``form_group``'s)
        self.reforms: Counter[str] = Counter()  # by reason: "fault", "join"
        self._gather = self._new_gather()
        self._next_poll = 0.0
        self._joiner_seen = False

    def _new_gather(self) -> Gather:
        return self.make_gather() if self.epoch.world_size > 1 else SingleRankGather()

    def all_gather(self, row: Packed) -> list[Packed]:
        for _ in range(MAX_REFORMS + 1):
            flag = int(self._joiner_waiting())
            try:
                rows = self._gather.all_gather((*row, flag))
            except RuntimeError:  # gloo/NCCL: a peer reset or the collective timed out
                self.reform("fault")
                continue
            if any(r[-1] for r in rows):
                self.reform("join")
                continue
            return [r[:-1] for r in rows]
        raise RuntimeError(
            f"group {self.epoch.group}: the gather failed through {MAX_REFORMS} re-forms"
        )

    def note_joiner(self) -> None:
        """A joiner was seen elsewhere (the idle pause): flag it in the next gather."""
        self._joiner_seen = True

    def _joiner_waiting(self) -> bool:
        now = time.monotonic()
        if not self._joiner_seen and now >= self._next_poll:
            self._next_poll = now + self.poll_s
            self._joiner_seen = bool(joiners(self.store, self.epoch))
            self.on_poll()
        return self._joiner_seen

    def reform(self, reason: str) -> None:
        """Agree on the next epoch (``Fenced`` propagates: this member must restart), form
        its group and tell the rank (also the rank's own call: a MoE collective failed
        mid-forward, ``ElasticForward``). A member lost while the new group forms, or while
        the rank re-homes a MoE model's experts over it (``on_reform`` runs collectives too),
        moves the members left to the epoch after, up to ``MAX_REFORMS`` times."""
        for attempt in range(MAX_REFORMS + 1):
            self.epoch = next_epoch(self.store, self.epoch, self.window_s)
            try:
                self.meeting = form_group(
                    self.store, self.epoch, self.backend, self.timeout_s, self.host
                )
                self._gather = self._new_gather()
                self._joiner_seen = False
                self._next_poll = 0.0
                self.reforms[reason] += 1
                self.on_reform(self.epoch, reason)
                return
            except Fenced:
                raise
            except RuntimeError:  # a collective of the new epoch failed: the next one
                if attempt == MAX_REFORMS:
                    raise
                reason = "fault"
