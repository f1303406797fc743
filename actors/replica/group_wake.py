"""How an idle DP group sleeps without burning CPU, and how one new request wakes all of it.

When the gathered rows show every rank idle, every rank pauses on the same round (the rows are
identical everywhere) and blocks here, outside any collective, so paused time never counts
toward ``--collective-timeout-s``. A rank that then gets work wakes the whole group for that
pause: the next round's gather needs every rank, not only the one the request was routed to.

Each pause has an epoch, counted alike on every rank (one per pause). A wake names its epoch,
and a rank paused at epoch ``e`` ignores older ones, so a late or repeated wake never starts a
rank alone (it would sit in a gather its peers never join). A wake sent before a rank reaches
its pause is kept and ends that pause at once, so no wake is lost.

Two transports, both a blocking wait with no polling:

- ``FifoWake`` (single node): one named pipe per rank in the temp directory. No socket at all,
  as the file rendezvous of single-node groups.
- ``StoreWake`` (multi-node): keys in the group's guarded TCP store on rank 0's node
  (``guarded_store``: its address only, behind the group's token); ``wait`` blocks in the
  store server.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import tempfile
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol

from roundgate.actors.replica import guarded_store

if TYPE_CHECKING:
    from torch.distributed import Store

    from roundgate.actors.replica.rendezvous import Meeting

# How often a paused rank looks at its stop flag (the replica is shutting down).
STOP_CHECK_S = 1.0
# How long a rank's wake clients try to reach rank 0's store (it is up: the group has met).
CONNECT_S = 300.0  # torch's own default for a store client


class GroupWake(Protocol):
    """Pause and wake for one rank of a DP group."""

    def wait(self, epoch: int, stop: StopFlag) -> bool:
        """Block until a wake for ``epoch`` (True) or ``stop`` is set (False)."""
        ...

    def wake(self, epoch: int) -> None:
        """End pause ``epoch`` on every rank of the group (any thread; never blocks long)."""
        ...

    def close(self) -> None: ...


class FifoWake:
    """Named pipes, one per rank: ``wake`` writes the epoch into every rank's pipe."""

    def __init__(self, gang_id: str, rank: int, world_size: int, folder: str | None = None):
        folder = folder or tempfile.gettempdir()
        self.paths = [
            os.path.join(folder, f"roundgate-wake-{gang_id}-{r}") for r in range(world_size)
        ]
        self.rank = rank
        path = self.paths[rank]
        if not os.path.exists(path):
            os.mkfifo(path, 0o600)
        # Non-blocking read end, plus a write end of our own so the pipe never reads as closed
        # (with no writer, select would report it readable forever).
        self._read = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._keep = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self._writers: dict[int, int] = {}
        self._lock = threading.Lock()
        self._seen = -1  # the newest epoch read from the pipe

    def wait(self, epoch: int, stop: threading.Event) -> bool:
        while self._seen < epoch:
            if stop.is_set():
                return False
            readable, _, _ = select.select([self._read], [], [], STOP_CHECK_S)
            if readable:
                self._drain()
        return True

    def _drain(self) -> None:
        try:
            data = os.read(self._read, 65536)
        except BlockingIOError:
            return
        for token in data.split():
            self._seen = max(self._seen, int(token))

    def wake(self, epoch: int) -> None:
        message = b"%d\n" % epoch
        with self._lock:  # the engine thread and the replica's event loop both wake
            for r, path in enumerate(self.paths):
                fd = self._writers.get(r)
                if fd is None:
                    try:
                        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                    except OSError as exc:
                        # No such pipe or no reader: that rank is gone or not up yet; the
                        # group's gather will tell (and restart it), not the wake.
                        if exc.errno in (errno.ENOENT, errno.ENXIO):
                            continue
                        raise
                    self._writers[r] = fd
                # A full pipe (64 KiB of unread wakes; the replica sends one per epoch) drops
                # this one: that rank is not paused, so it reads the backlog at its next pause.
                with contextlib.suppress(BlockingIOError):
                    os.write(fd, message)

    def close(self) -> None:
        for fd in (self._read, self._keep, *self._writers.values()):
            os.close(fd)
        self._writers.clear()
        os.unlink(self.paths[self.rank])


class StoreWake:
    """Keys in a TCP store: ``wake`` sets ``{prefix}/{epoch}``, ``wait`` blocks on it.

    The store's client serializes its calls, and a ``wait`` holds it until the key shows up,
    so waking (any thread) goes through a client of its own: ``waiter`` and ``waker`` are two
    clients of the same store (each behind the group's token when served).
    """

    def __init__(self, waiter: Store, waker: Store, prefix: str) -> None:
        self.prefix = prefix
        self._waiter, self._waker = waiter, waker
        self._lock = threading.Lock()

    def _key(self, epoch: int) -> str:
        return f"{self.prefix}/{epoch}"

    def wait(self, epoch: int, stop: threading.Event) -> bool:
        key = self._key(epoch)
        while not stop.is_set():
            try:
                self._waiter.wait([key], timedelta(seconds=STOP_CHECK_S))
                return True
            except RuntimeError:  # the wait timed out (torch raises DistStoreError)
                continue
        return False

    def wake(self, epoch: int) -> None:
        with self._lock:
            self._waker.set(self._key(epoch), b"1")

    def close(self) -> None:
        """Nothing to release: the clients close with the process."""


def open_group_wake(meeting: Meeting, gang_id: str, rank: int, world_size: int) -> GroupWake:
    """The wake of a group that met at ``meeting`` (``file://``: one node; ``tcp://``: rank
    0's guarded store, which also serves the wake keys, to the group's token only)."""
    if meeting.init_method.startswith("file://"):
        return FifoWake(gang_id, rank, world_size)
    host, port = guarded_store.split_tcp(meeting.init_method)
    # A wait may block for as long as the group stays idle: the clients' own timeout only
    # bounds connecting (each wait passes its own).
    waiter, waker = (
        guarded_store.guard(guarded_store.connect(host, port, CONNECT_S), meeting.token)
        for _ in range(2)
    )
    return StoreWake(waiter, waker, f"roundgate/wake/{gang_id}")


class StopFlag(Protocol):
    """What a paused rank looks at each ``STOP_CHECK_S``: a ``threading.Event`` or the like."""

    def is_set(self) -> bool: ...


class GroupPause:
    """One rank's pauses over a ``GroupWake``: their epochs, counted alike on every rank.

    Read and written by the engine thread (``pause``) and the event loop (``wake``). A
    membership owns one; an elastic group's re-form gives it the new group's channel.
    """

    def __init__(self, channel: GroupWake) -> None:
        self.channel = channel
        self.epoch = 0  # the newest pause's epoch
        self.paused_at: int | None = None  # the pause this rank is in (None: running rounds)
        self.woken = -1  # the last pause a request woke

    def pause(self, wake_now: bool, stop: Callable[[int], StopFlag]) -> None:
        """Sleep with the whole group until a request arrives on any rank.

        Every rank sees the same idle rows and pauses on the same round, so the epochs agree.
        ``paused_at`` is set before the engine looks at the intake again: a request submitted
        after that finds the epoch and wakes it (``wake``); one submitted before is seen here
        (``wake_now``: this rank has work, so it wakes the group itself). ``stop(epoch)``: what
        the wait checks each ``STOP_CHECK_S``.
        """
        self.epoch += 1
        epoch = self.paused_at = self.epoch
        try:
            if wake_now:
                self.channel.wake(epoch)
            self.channel.wait(epoch, stop(epoch))
        finally:
            self.paused_at = None

    def wake(self) -> None:
        """A request was queued on this rank: end the group's pause, if it is in one."""
        epoch = self.paused_at
        if epoch is not None and epoch != self.woken:
            self.woken = epoch
            self.channel.wake(epoch)

    def wake_epoch(self, epoch: int) -> None:
        """End pause ``epoch`` on every rank, whoever woke it before (a joiner is waiting)."""
        self.channel.wake(epoch)

    def replace(self, channel: GroupWake) -> None:
        """A new group's channel (an elastic re-form): its pauses are counted afresh."""
        old, self.channel = self.channel, channel
        self.epoch, self.woken = 0, -1
        old.close()

    def close(self) -> None:
        self.channel.close()
