"""What a rank's engine thread hands its event loop each round, and when.

Everything a round produces for the request streams (token events, a prefill rank's handoffs,
a decode rank's reservations) goes through one ``RoundOutbox``, in order, and reaches the loop
in one ``call_soon_threadsafe`` (one wake-up of the loop a round, however many streams).

When it goes: at the end of the round, unless this rank is the only one that had work
(``holds``); then it goes right after the next all-gather returns (``SendAfterGather``).
A delivered token sets off a burst of work on every process of the serving path at once (this
replica's loop and Ray stream, the ingress, the proxy, the client). Sent at the end of the
round, that burst lands in the next all-gather, which on gloo waits for the idle peer's device
thread to wake and answer (gloo sends a row only once the receiver has posted its receive), and
the peer's threads queue behind the burst for one of the node's cores. Held, the burst runs
during the next forward instead, beside it on a core the idle peer leaves free.

The hold is safe only because every other rank had nothing to run: they are already waiting in
the next gather, so held items wait just this rank's own schedule and gather. With a busy peer
the next gather may wait out that peer's whole forward, so the items go at once.
``benchmarks/bench_gather.py`` measures both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from roundgate.actors.control.gather import Gather, Packed
from roundgate.gate.rows import RankRow


def holds(rows: Sequence[RankRow], rank: int) -> bool:
    """Whether ``rank`` alone had work in the round of ``rows`` (a group of two or more).

    >>> busy, idle = RankRow(1, 1, 0, False, True), RankRow(0, 0, 0, False, False)
    >>> holds([busy, idle], 0), holds([busy, idle], 1), holds([busy, busy], 0), holds([busy], 0)
    (True, False, False, False)
    """
    if len(rows) < 2 or _is_idle(rows[rank]):
        return False
    return all(_is_idle(row) for i, row in enumerate(rows) if i != rank)


def _is_idle(row: RankRow) -> bool:
    return row.batch_size == 0 and row.num_tokens == 0


class RoundOutbox:
    """Stream items put on the engine thread, handed to ``loop`` in order by ``send``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: list[tuple[asyncio.Queue, Any]] = []

    def put(self, queue: asyncio.Queue, item: Any) -> None:
        self._items.append((queue, item))

    def send(self) -> None:
        """Everything put so far, to its queues, in one hand-off to the loop."""
        if self._items:
            items, self._items = self._items, []
            self._loop.call_soon_threadsafe(_deliver, items)

    def end_round(self, rows: Sequence[RankRow], rank: int) -> None:
        """Send the round's items now, or hold them for the next gather (``holds``)."""
        if not holds(rows, rank):
            self.send()

    @property
    def num_held(self) -> int:
        return len(self._items)


def _deliver(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


class SendAfterGather:
    """A ``Gather`` that sends the outbox's held items as soon as the collective returns.

    The send (one ``call_soon_threadsafe``) counts in the round's ``gather`` part: a few
    microseconds against the collective's hundreds.
    """

    def __init__(self, gather: Gather, outbox: RoundOutbox) -> None:
        self.gather = gather
        self.outbox = outbox

    def all_gather(self, row: Packed) -> list[Packed]:
        rows = self.gather.all_gather(row)
        self.outbox.send()
        return rows
