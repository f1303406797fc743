"""The idle group's pause: a wake for the current epoch ends every rank's pause, an old one
none, a wake sent before the pause is kept, and a stop ends a pause without a wake."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from actors.replica.group_wake import FifoWake, GroupWake, StoreWake

WORLD = 3


@pytest.fixture(params=["fifo", "store"])
def group(request: pytest.FixtureRequest, tmp_path) -> Iterator[list[GroupWake]]:
    if request.param == "fifo":
        wakes: list[GroupWake] = [FifoWake("g1", r, WORLD, str(tmp_path)) for r in range(WORLD)]
        yield wakes
    else:
        import torch.distributed as dist

        server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        wakes = [StoreWake("127.0.0.1", server.port, "roundgate/wake/g1") for _ in range(WORLD)]
        yield wakes
        del server
    for wake in wakes:
        wake.close()


class Paused:
    """Every rank of the group in pause ``epoch``, one thread each (as their engine threads)."""

    def __init__(self, wakes: list[GroupWake], epoch: int, stop: threading.Event) -> None:
        self.results: dict[int, bool] = {}
        self.threads = [
            threading.Thread(target=self._run, args=(w, r, epoch, stop), daemon=True)
            for r, w in enumerate(wakes)
        ]
        for t in self.threads:
            t.start()

    def _run(self, wake: GroupWake, r: int, epoch: int, stop: threading.Event) -> None:
        self.results[r] = wake.wait(epoch, stop)

    def any_paused(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def all_paused(self) -> bool:
        return all(t.is_alive() for t in self.threads)

    def join(self) -> None:
        for t in self.threads:
            t.join(5)


def test_one_ranks_wake_ends_every_ranks_pause(group: list[GroupWake]) -> None:
    stop = threading.Event()
    paused = Paused(group, 1, stop)
    time.sleep(0.2)
    assert paused.all_paused()  # nobody has work yet
    started = time.monotonic()
    group[2].wake(1)  # a request arrived on rank 2
    paused.join()
    assert not paused.any_paused()
    assert paused.results == {0: True, 1: True, 2: True}
    assert time.monotonic() - started < 1.0  # woken by the wake, not by a stop check


def test_an_old_epochs_wake_starts_no_rank(group: list[GroupWake]) -> None:
    stop = threading.Event()
    group[0].wake(1)  # pause 1, ended by rank 0
    for wake in group:
        assert wake.wait(1, stop)
    group[1].wake(1)  # late, repeated wakes of pause 1
    group[2].wake(1)
    paused = Paused(group, 2, stop)
    time.sleep(0.3)
    assert paused.all_paused(), "a stale wake started a rank alone"
    group[1].wake(2)
    paused.join()
    assert not paused.any_paused()


def test_a_wake_sent_before_the_pause_is_kept(group: list[GroupWake]) -> None:
    group[1].wake(5)  # rank 1 woke epoch 5 while the others were finishing their round
    stop = threading.Event()
    started = time.monotonic()
    assert all(wake.wait(5, stop) for wake in group)
    assert time.monotonic() - started < 1.0


def test_stop_ends_a_pause_without_a_wake(group: list[GroupWake]) -> None:
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
    assert rank0.wait(1, threading.Event())
    rank0.close()
