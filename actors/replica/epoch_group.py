"""The process group of one membership epoch: formed among the epoch's members only.

Each epoch meets at its own place (a file for a single-node group, a TCP port on the new rank
0's node otherwise), published by the epoch's rank 0 in the membership store, so a member of
an older epoch can never reach it. The previous group is left first; leaving never waits for
a dead peer (gloo's teardown is local; on NCCL the communicator must be aborted, not
destroyed, for the same reason).
"""

from __future__ import annotations

import time

from roundgate.actors.replica import rendezvous
from roundgate.actors.replica.membership import POLL_S, Epoch, MembershipStore


def meeting_key(epoch: Epoch) -> str:
    return f"roundgate/membership/{epoch.group}/{epoch.number}/meeting"


def form_group(
    store: MembershipStore,
    epoch: Epoch,
    backend: str,
    timeout_s: float,
    host: str | None = None,
) -> rendezvous.Meeting:
    """Leave the current process group and join ``epoch``'s; ``timeout_s`` bounds the meeting
    and every later collective of the group (a hung member is excluded after it)."""
    key = meeting_key(epoch)
    if epoch.rank == 0:
        meeting = rendezvous.choose_meeting(f"{epoch.group}-e{epoch.number}", backend, host)
        store.put_if_absent(key, meeting.encode())
    deadline = time.monotonic() + timeout_s
    while (value := store.get(key)) is None:
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"group {epoch.group}: epoch {epoch.number}'s rank 0 published no meeting "
                f"in {timeout_s:g}s"
            )
        time.sleep(POLL_S)
    meeting = rendezvous.Meeting.decode(value)
    leave_group()
    rendezvous.join(meeting, epoch.rank, epoch.world_size, timeout_s)
    return meeting


def leave_group() -> None:
    """Tear down this process's group, if any, without waiting for its other members."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
