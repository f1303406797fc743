"""The idle group's pause: a wake for the current epoch ends every rank's pause, an old one
none, a wake sent before the pause is kept, and a stop ends a pause without a wake."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from roundgate.actors.replica import group_wake, guarded_store
from roundgate.actors.replica.group_wake import FifoWake, GroupWake, open_group_wake
from roundgate.actors.replica.rendezvous import Meeting

WORLD = 3
# How long a test waits for a condition before failing (a deadline, not a speed): far below
# ``NO_POLL_S``, so a pause that ends inside it was ended by a wake, never by a stop check.
DEADLINE_S = 30.0
NO_POLL_S = 3600.0  # ``STOP_CHECK_S`` where a pause may end only by a wake
ONE_CYCLE_S = 0.05  # ``STOP_CHECK_S`` where a test runs whole wait cycles (``Stop(after=1)``)


@pytest.fixture(params=["fifo", "store"])
def group(request: pytest.FixtureRequest, tmp_path) -> Iterator[list[GroupWake]]:
    if request.param == "fifo":
        wakes: list[GroupWake] = [FifoWake("g1", r, WORLD, str(tmp_path)) for r in range(WORLD)]
        yield wakes
    else:  # a multi-node group's: rank 0's guarded store, reached with the group's token
        server = guarded_store.serve("127.0.0.1", 0, DEADLINE_S)
        meeting = Meeting(f"tcp://127.0.0.1:{server.port}", "gloo", guarded_store.new_token())
        wakes = [open_group_wake(meeting, "g1", r, WORLD) for r in range(WORLD)]
        yield wakes
        del server
    for wake in wakes:
        wake.close()


class Stop(threading.Event):
    """A rank's stop flag that reports the wait's own progress instead of a sleep.

    ``wait`` reads its stop flag once on entering its loop and once after each cycle that
    ended without a wake, so: ``entered`` is set at the first read (the rank is in its pause),
    and with ``after=n`` the flag reads set from read ``n + 1`` on (the pause gives up after
    ``n`` whole cycles, each of which saw every wake already sent).
    """

    def __init__(self, after: int | None = None) -> None:
        super().__init__()
        self.after, self.reads = after, 0
        self.entered = threading.Event()

    def is_set(self) -> bool:
        self.reads += 1
        self.entered.set()
        return super().is_set() or (self.after is not None and self.reads > self.after)


def one_cycle(wake: GroupWake, epoch: int) -> bool:
    """One whole wait cycle of pause ``epoch``: True only if a wake for it is already there."""
    return wake.wait(epoch, Stop(after=1))


class Paused:
    """Every rank of the group in pause ``epoch``, one thread each (as their engine threads)."""

    def __init__(
        self, wakes: list[GroupWake], epoch: int, stop: threading.Event | list[Stop]
    ) -> None:
        stops = stop if isinstance(stop, list) else [stop] * len(wakes)
        self.results: dict[int, bool] = {}
        self.threads = [
            threading.Thread(target=self._run, args=(w, r, epoch, s), daemon=True)
            for r, (w, s) in enumerate(zip(wakes, stops, strict=True))
        ]
        for t in self.threads:
            t.start()

    def _run(self, wake: GroupWake, r: int, epoch: int, stop: threading.Event) -> None:
        self.results[r] = wake.wait(epoch, stop)

    def any_paused(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def join(self) -> None:
        deadline = time.monotonic() + DEADLINE_S  # one deadline for all (a failure's bound)
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def test_one_ranks_wake_ends_every_ranks_pause(group: list[GroupWake], monkeypatch) -> None:
    monkeypatch.setattr(group_wake, "STOP_CHECK_S", NO_POLL_S)
    stops = [Stop() for _ in group]
    paused = Paused(group, 1, stops)
    for stop in stops:  # every rank has entered its pause: nobody has work yet
        assert stop.entered.wait(DEADLINE_S)
    group[2].wake(1)  # a request arrived on rank 2
    paused.join()
    assert not paused.any_paused(), "a rank's pause outlasted the wake"
    assert paused.results == {0: True, 1: True, 2: True}


def test_an_old_epochs_wake_starts_no_rank(group: list[GroupWake], monkeypatch) -> None:
    monkeypatch.setattr(group_wake, "STOP_CHECK_S", ONE_CYCLE_S)
    group[0].wake(1)  # pause 1, ended by rank 0
    for wake in group:
        assert one_cycle(wake, 1)
    group[1].wake(1)  # late, repeated wakes of pause 1
    group[2].wake(1)
    # A whole wait cycle of pause 2 reads every stale wake and stays paused.
    assert [one_cycle(w, 2) for w in group] == [False] * WORLD, "a stale wake started a rank"
    group[1].wake(2)
    assert [one_cycle(w, 2) for w in group] == [True] * WORLD


def test_a_wake_sent_before_the_pause_is_kept(group: list[GroupWake], monkeypatch) -> None:
    monkeypatch.setattr(group_wake, "STOP_CHECK_S", ONE_CYCLE_S)
    group[1].wake(5)  # rank 1 woke epoch 5 while the others were finishing their round
    # Kept: each rank's first wait cycle of pause 5 already finds it.
    assert [one_cycle(w, 5) for w in group] == [True] * WORLD


def test_stop_ends_a_pause_without_a_wake(group: list[GroupWake], monkeypatch) -> None:
    monkeypatch.setattr(group_wake, "STOP_CHECK_S", ONE_CYCLE_S)
    stop = threading.Event()
    paused = Paused(group, 7, stop)
    stop.set()
    paused.join()
    assert not paused.any_paused()
    assert paused.results == {0: False, 1: False, 2: False}


def test_a_missing_rank_does_not_block_the_wake(tmp_path) -> None:
    # Rank 1 never came up (or is gone): waking the group still ends rank 0's pause.
    rank0 = FifoWake("g2", 0, 2, str(tmp_path))
    rank0.wake(1)
    assert one_cycle(rank0, 1)
    rank0.close()
