"""A rank's membership of a Serve gang: a fixed group, restarted whole when a member dies.

The gang context names the rank and the group; rank 0 publishes where the group meets
(``rendezvous``), every rank joins ``torch.distributed`` there, and the group's idle pause
gets its wake channel (``group_wake``). A group of one gathers its own row: no collective.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from roundgate.actors.control.gather import Gather, SingleRankGather
from roundgate.actors.replica import rendezvous
from roundgate.actors.replica.group_wake import GroupPause, open_group_wake
from roundgate.actors.replica.node import device_type, multinode_host
from roundgate.actors.replica.outbox import RoundOutbox, SendAfterGather
from roundgate.actors.replica.rank_parts import OnRegroup
from roundgate.actors.server_args import ServerArgs

if TYPE_CHECKING:
    from roundgate.actors.model.runner import ModelRunner


class GangMembership:
    """``RankMembership`` of a gang rank: its rank, world size and process group never change."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        gang_id: str,
        device: str,
        wake: GroupPause,
        gather_group: Any = None,
    ):
        self.rank = rank
        self.gang_id = gang_id
        self.device = device
        self.pauses = wake
        self._world_size = world_size
        # The round's gather on a process group of its own (None: the default group), where
        # it may run beside the forward's expert collectives (``--async-scheduling``).
        self.gather_group = gather_group

    @classmethod
    async def join(cls, args: ServerArgs) -> GangMembership:
        """This replica's place in its gang, with the group's process group joined."""
        from ray import serve

        gang = serve.get_replica_context().gang_context
        if gang is None:
            raise RuntimeError("RankReplica needs gang scheduling (gang_scheduling_config)")
        rank, world_size, gang_id = gang.rank, gang.world_size, gang.gang_id
        if world_size != args.dp_size:
            raise ValueError(f"gang of {world_size} replicas but --dp-size {args.dp_size}")
        device = device_type(args.device)
        backend = "nccl" if device == "cuda" else "gloo"
        timeout = args.collective_timeout_s
        if rank == 0:
            meeting = rendezvous.choose_meeting(gang_id, backend, multinode_host())
            rendezvous.publish(gang_id, meeting)
        else:
            meeting = await asyncio.to_thread(rendezvous.lookup, gang_id, timeout)
        await asyncio.to_thread(rendezvous.join, meeting, rank, world_size, timeout)
        wake = GroupPause(open_group_wake(meeting, gang_id, rank, world_size))
        gather_group = None
        if args.async_scheduling and args.model_config.is_moe and world_size > 1:
            # Round N+1's gather runs while round N's forward exchanges experts: two
            # collectives at once, which one process group cannot order (every rank makes
            # this group here, at the same point).
            import torch.distributed as dist

            gather_group = await asyncio.to_thread(dist.new_group, backend=backend)
        return cls(rank, world_size, gang_id, device, wake, gather_group)

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def row_rank(self) -> int:
        return self.rank  # a gang's rows are in rank order

    @property
    def epoch(self) -> None:
        return None

    def build_runner(self, args: ServerArgs) -> ModelRunner:
        import torch.distributed as dist

        from roundgate.actors.model.runner import ModelRunner

        return ModelRunner(args, rank=self.rank, group=dist.group.WORLD)

    def executor(self, runner: ModelRunner) -> ModelRunner:
        """The runner itself: a gang never re-forms (a failed collective ends it)."""
        return runner

    async def enter(self, outbox: RoundOutbox, on_regroup: OnRegroup) -> Gather:
        """The gang formed at ``join``; its gather (a group of one: its own row)."""
        if self.world_size == 1:
            return SingleRankGather()
        from roundgate.actors.replica.torch_gather import TorchGather

        return SendAfterGather(TorchGather(self.gather_group, device=self.device), outbox)

    def pause(self, wake_now: bool, stop: threading.Event) -> None:
        self.pauses.pause(wake_now, lambda epoch: stop)

    def wake(self) -> None:
        self.pauses.wake()

    def close(self) -> None:
        self.pauses.close()
