"""Process-group rendezvous for one DP group (a Serve gang), keyed by the gang id.

Rank 0 publishes where the group meets in Ray's internal KV store; every rank then joins
``torch.distributed`` with a bounded timeout. A restarted gang gets a new gang id, so it can
never rejoin the old (broken) process group.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta

KEY_PREFIX = "roundgate/rendezvous/"


@dataclass(frozen=True)
class Meeting:
    """Where a gang's ranks meet: a ``tcp://`` or ``file://`` init method."""

    init_method: str
    backend: str


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free on ``host`` (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def choose_meeting(gang_id: str, backend: str, host: str | None) -> Meeting:
    """Single-node groups meet through a file (no listening socket at all); multi-node
    groups through TCP on rank 0's node address.
    """
    if host is None:
        path = os.path.join(tempfile.gettempdir(), f"roundgate-pg-{gang_id}")
        if os.path.exists(path):
            os.remove(path)
        return Meeting(f"file://{path}", backend)
    return Meeting(f"tcp://{host}:{free_port(host)}", backend)


def publish(gang_id: str, meeting: Meeting) -> None:
    from ray.experimental.internal_kv import _internal_kv_put

    value = json.dumps({"init_method": meeting.init_method, "backend": meeting.backend})
    _internal_kv_put((KEY_PREFIX + gang_id).encode(), value.encode(), overwrite=True)


def lookup(gang_id: str, timeout_s: float, poll_s: float = 0.1) -> Meeting:
    """Wait for rank 0's meeting point; ``TimeoutError`` names the gang."""
    from ray.experimental.internal_kv import _internal_kv_get

    deadline = time.monotonic() + timeout_s
    while True:
        data = _internal_kv_get((KEY_PREFIX + gang_id).encode())
        if data is not None:
            obj = json.loads(data)
            return Meeting(obj["init_method"], obj["backend"])
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"gang {gang_id}: rank 0 did not publish a rendezvous in {timeout_s:.0f}s"
            )
        time.sleep(poll_s)


def join(meeting: Meeting, rank: int, world_size: int, timeout_s: float) -> None:
    """``init_process_group`` with a bounded timeout (also bounds every later collective)."""
    import torch.distributed as dist

    # Keep gloo's pair sockets on loopback for single-node (file rendezvous) groups.
    if meeting.backend == "gloo" and meeting.init_method.startswith("file://"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        meeting.backend,
        init_method=meeting.init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
