"""A rank's round outbox: held only while the rank alone has work, sent after the next gather."""

from __future__ import annotations

import asyncio
import doctest
import threading

import pytest

from roundgate.actors.control.gather import ThreadGather
from roundgate.actors.replica import outbox
from roundgate.actors.replica.outbox import RoundOutbox, SendAfterGather, holds
from roundgate.gate.rows import RankRow

BUSY = RankRow(1, 1, 0, False, True)
PREFILL = RankRow(256, 1, 1, True, False)
IDLE = RankRow(0, 0, 0, False, False)
WAITING = RankRow(0, 0, 0, True, False)  # a prompt queued, nothing planned this round


@pytest.mark.parametrize(
    ("rows", "rank", "held"),
    [
        ([BUSY, IDLE], 0, True),  # alone with work: the peer already waits in the next gather
        ([PREFILL, IDLE], 0, True),
        ([BUSY, WAITING], 0, True),  # the peer's queued prompt runs after the next gather
        ([BUSY, IDLE, IDLE, IDLE], 0, True),
        ([IDLE, BUSY], 0, False),  # nothing of its own to hold
        ([IDLE, BUSY], 1, True),
        ([BUSY, BUSY], 0, False),  # the next gather may wait out the peer's forward
        ([BUSY, IDLE, PREFILL], 0, False),
        ([IDLE, IDLE], 0, False),  # the group pauses: nothing may wait for a gather
        ([BUSY], 0, False),  # dp=1: no gather to wait for
    ],
)
def test_holds(rows: list[RankRow], rank: int, held: bool) -> None:
    assert holds(rows, rank) is held


def test_doctests() -> None:
    assert doctest.testmod(outbox).failed == 0


class CountingLoop(asyncio.SelectorEventLoop):
    """A real event loop that counts the engine thread's hand-offs."""

    def __init__(self) -> None:
        super().__init__()
        self.num_hand_offs = 0

    def call_soon_threadsafe(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.num_hand_offs += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def test_send_delivers_in_order_in_one_hand_off() -> None:
    loop = CountingLoop()
    try:
        box = RoundOutbox(loop)
        a, b = asyncio.Queue(), asyncio.Queue()
        for queue, item in [(a, 1), (b, "x"), (a, 2), (a, 3)]:
            box.put(queue, item)
        assert box.num_held == 4
        box.send()
        assert box.num_held == 0
        assert loop.num_hand_offs == 1  # one for the whole round, not one per item
        loop.run_until_complete(asyncio.sleep(0))
        assert [a.get_nowait() for _ in range(a.qsize())] == [1, 2, 3]
        assert b.get_nowait() == "x"
        box.send()  # nothing put: nothing handed off
        assert loop.num_hand_offs == 1
    finally:
        loop.close()


@pytest.mark.parametrize(
    ("rows", "sent"), [([BUSY, IDLE], False), ([BUSY, BUSY], True), ([IDLE, IDLE], True)]
)
def test_end_round(rows: list[RankRow], sent: bool) -> None:
    loop = asyncio.new_event_loop()
    try:
        box = RoundOutbox(loop)
        box.put(asyncio.Queue(), "token")
        box.end_round(rows, 0)
        assert box.num_held == (0 if sent else 1)
    finally:
        loop.close()


def test_held_items_go_when_the_next_gather_returns() -> None:
    """Two ranks as threads: rank 0 holds its round's item; the peer's row releases it."""
    loop = asyncio.new_event_loop()
    try:
        group = ThreadGather(2, timeout=10)
        box = RoundOutbox(loop)
        gather = SendAfterGather(group.for_rank(0), box)
        queue: asyncio.Queue = asyncio.Queue()
        box.put(queue, "token")
        box.end_round([BUSY, IDLE], 0)
        peer_rows: list = []
        peer = threading.Thread(
            target=lambda: peer_rows.append(group.for_rank(1).all_gather(IDLE.pack()))
        )
        peer.start()
        assert box.num_held == 1  # still held while the collective is open
        rows = gather.all_gather(BUSY.pack())
        peer.join(timeout=10)
        assert rows == peer_rows[0] == [BUSY.pack(), IDLE.pack()]
        assert box.num_held == 0
        loop.run_until_complete(asyncio.sleep(0))
        assert queue.get_nowait() == "token"
    finally:
        loop.close()
