"""Process-group rendezvous for one DP group (a Serve gang), keyed by the gang id.

Rank 0 publishes where the group meets in Ray's internal KV store; every rank then joins
``torch.distributed`` with a bounded timeout. A restarted gang gets a new gang id, so it can
never rejoin the old (broken) process group.

A multi-node meeting is a guarded TCP store (``guarded_store``): rank 0 serves it on its
node's address only, and the meeting record carries the group's token, so only a reader of
Ray's KV (a member of the cluster) can use the store the group forms over.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from roundgate.actors.replica import guarded_store
from roundgate.actors.replica.guarded_store import free_port

if TYPE_CHECKING:
    import torch.distributed as dist

KEY_PREFIX = "roundgate/rendezvous/"


@dataclass(frozen=True)
class Meeting:
    """Where a group's ranks meet: a ``tcp://`` or ``file://`` init method, and for TCP the
    group's token (its store serves nothing to a client without it)."""

    init_method: str
    backend: str
    token: str = ""

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str | bytes) -> Meeting:
        return cls(**json.loads(text))


def choose_meeting(gang_id: str, backend: str, host: str | None) -> Meeting:
    """Single-node groups meet through a file (no listening socket at all); multi-node
    groups through a guarded TCP store on rank 0's node address, with a fresh token.
    """
    if host is None:
        path = os.path.join(tempfile.gettempdir(), f"roundgate-pg-{gang_id}")
        if os.path.exists(path):
            os.remove(path)
        return Meeting(f"file://{path}", backend)
    port = free_port(host)
    return Meeting(f"tcp://{host}:{port}", backend, guarded_store.new_token())


def publish(gang_id: str, meeting: Meeting) -> None:
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put((KEY_PREFIX + gang_id).encode(), meeting.encode().encode(), overwrite=True)


def lookup(gang_id: str, timeout_s: float, poll_s: float = 0.1) -> Meeting:
    """Wait for rank 0's meeting point; ``TimeoutError`` names the gang."""
    from ray.experimental.internal_kv import _internal_kv_get

    deadline = time.monotonic() + timeout_s
    while True:
        data = _internal_kv_get((KEY_PREFIX + gang_id).encode())
        if data is not None:
            return Meeting.decode(data)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"gang {gang_id}: rank 0 did not publish a rendezvous in {timeout_s:.0f}s"
            )
        time.sleep(poll_s)


def join(meeting: Meeting, rank: int, world_size: int, timeout_s: float) -> None:
    """``init_process_group`` with a bounded timeout (also bounds every later collective).

    A TCP meeting's store is made here, not by torch's ``tcp://`` handler (which listens on
    every interface and takes anyone): rank 0 serves it on the meeting's address, every rank
    uses it behind the group's token, and the process group keeps it alive.
    """
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if meeting.init_method.startswith("file://"):
        # Keep gloo's pair sockets on loopback for single-node (file rendezvous) groups.
        if meeting.backend == "gloo":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            meeting.backend,
            init_method=meeting.init_method,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
        )
        return
    store = open_store(meeting, rank == 0, timeout_s)
    dist.init_process_group(
        meeting.backend, store=store, rank=rank, world_size=world_size, timeout=timeout
    )


def open_store(meeting: Meeting, is_master: bool, timeout_s: float) -> dist.Store:
    """A TCP meeting's store as the group sees it (behind its token); the master listens."""
    host, port = guarded_store.split_tcp(meeting.init_method)
    if is_master:
        base = guarded_store.serve(host, port, timeout_s)
    else:
        base = guarded_store.connect(host, port, timeout_s)
    return guarded_store.guard(base, meeting.token)
