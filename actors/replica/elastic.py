"""A rank replica's elastic side: its seat, its group's epochs, and what a re-form resets.

With ``elastic_dp`` the rank replicas are not a Serve gang, so Serve replaces a dead replica
by itself and the others keep running. A replica takes a seat (its group and ``dp_rank``),
loads its model, then starts its group or is admitted to it (``elastic_member``); its rounds
gather through ``ElasticGather``, which re-forms the group when a member dies or hangs and
admits a joiner at a round boundary. On every new epoch the rank resets what depends on the
group: the prefill policy starts over on the new group's rows (the gate's counter restarts;
round 0 is an ALL point), the idle pause gets the new group's wake channel, and the epoch's
rank 0 frees the seats of members that left, so their replacements can take them.

Only a dense model can do this: experts sharded across the group (expert parallelism) are
lost with a rank, so such a group keeps whole-group restart (``docs/fault-tolerance.md``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from roundgate.actors.replica import seats
from roundgate.actors.replica.elastic_gather import ElasticGather
from roundgate.actors.replica.elastic_member import ElasticSpec, enter, group_id
from roundgate.actors.replica.epoch_group import form_group
from roundgate.actors.replica.membership import Epoch, RayKvStore, joiners
from roundgate.actors.replica.node import node_id

# A seat whose holder has not said it is alive for this long is free to take.
STALE_S = 30.0
BEAT_S = 1.0


class ElasticRank:
    """The elastic half of one ``RankReplica`` (built only with ``elastic_dp``)."""

    def __init__(self, spec: ElasticSpec, replica: Any) -> None:
        # ``replica``: the ``RankReplica`` this belongs to (its engine core, wake channel,
        # metrics and flags), not imported here: the replica imports this module.
        self.spec = spec
        self.replica = replica
        self.store = RayKvStore()
        self.me = ""
        self.seat: seats.Seat | None = None
        self.gather: ElasticGather | None = None
        self._last_beat = 0.0
        self._members: set[str] = set()  # the last epoch's, to tell who departed

    async def take_seat(self) -> tuple[int, int, str]:
        """This replica's seat: (dp_rank, the group's full size, the group's id)."""
        from ray import serve

        self.me = str(serve.get_replica_context().replica_id.unique_id)
        dp_size = self.replica.args.dp_size
        self.seat = await asyncio.to_thread(
            seats.claim,
            self.store,
            self.spec.deployment,
            self.spec.num_groups,
            dp_size,
            self.me,
            STALE_S,
            await asyncio.to_thread(node_id) if self.spec.spread else None,
        )
        return self.seat.dp_rank, dp_size, group_id(self.spec, self.seat.group)

    def build_runner(self, runner_class: type) -> Any:
        """The model runner of a dense model (a group of one, as far as the model knows)."""
        args = self.replica.args
        try:
            return runner_class(args, rank=0, group=None)
        except RuntimeError as exc:
            if args.dp_size > 1 and "process group" in str(exc):
                raise ValueError(
                    f"elastic_dp: {args.model} shards its experts across the group's ranks, "
                    "and a group that loses a rank loses its experts; serve it without "
                    "elastic_dp (whole-group restart)"
                ) from exc
            raise

    async def enter(self) -> None:
        """Start the seat's group or be admitted to it, then form its process group."""
        from roundgate.actors.replica.node import device_type, multinode_host
        from roundgate.actors.replica.outbox import SendAfterGather
        from roundgate.actors.replica.torch_gather import TorchGather

        replica, args = self.replica, self.replica.args
        timeout = args.collective_timeout_s
        host = await asyncio.to_thread(multinode_host)
        # Members admit a joiner at a round boundary, or within a second when idle.
        admit_s = max(60.0, 3 * timeout)
        epoch = await asyncio.to_thread(enter, self.store, self.spec, self.seat, self.me, admit_s)
        meeting = await asyncio.to_thread(
            form_group, self.store, epoch, replica._backend, timeout, host
        )
        device = device_type(args.device)
        self.gather = ElasticGather(
            self.store,
            epoch,
            replica._backend,
            timeout,
            self.spec.window_s,
            lambda: TorchGather(device=device),
            on_reform=self._on_reform,
            poll_s=BEAT_S,
            host=host,
            on_poll=self._gathering_beat,
            meeting=meeting,
        )
        replica.core.loop.gather = SendAfterGather(self.gather, replica._outbox)
        self._apply(epoch, None)

    def _on_reform(self, epoch: Epoch, reason: str) -> None:
        self._apply(epoch, reason)

    def _apply(self, epoch: Epoch, reason: str | None) -> None:
        """What a new epoch resets (on the engine thread, or before rounds start)."""
        from roundgate.actors.replica.group_wake import open_group_wake
        from roundgate.gate import registry
        from roundgate.gate.spec import PolicyContext

        replica, args = self.replica, self.replica.args
        spec = registry.get(args.prefill_policy_name)
        context = PolicyContext(epoch.rank, epoch.world_size, args.max_batch_size)
        replica.core.loop.regroup(spec.build(args.policy_config, context), epoch.world_size)
        replica.world_size = epoch.world_size
        old = replica._wake
        assert self.gather is not None
        replica._wake = open_group_wake(
            self.gather.meeting.init_method,
            f"{epoch.group}-e{epoch.number}",
            epoch.rank,
            epoch.world_size,
        )
        replica._pause_epoch, replica._woken = 0, -1  # the new group counts pauses afresh
        if old is not None:
            old.close()
        replica.row_rank = epoch.rank
        replica.metrics.note_group(epoch.world_size, reason, epoch.rank)
        departed, self._members = self._members - set(epoch.members), set(epoch.members)
        if epoch.rank == 0 and self.seat is not None and departed:
            seats.release_departed(
                self.store, self.spec.deployment, self.seat.group, args.dp_size, departed
            )

    def _beat(self, reclaim: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_beat >= BEAT_S:
            self._last_beat = now
            seat = self.seat if reclaim else None
            seats.beat(self.store, self.spec.deployment, self.me, seat=seat)

    def _gathering_beat(self) -> None:
        """The beat of a member that is gathering rounds in the current epoch: it is in the
        group, so a seat freed under it is taken back (a paused member may have been left
        out of an epoch it slept through, and must not)."""
        self._beat(reclaim=True)

    def pause_stop(self, pause_epoch: int) -> _PauseStop:
        """What the idle pause checks each second: the replica stopping, or a joiner waiting
        (the pause then wakes the whole group, whose next gather admits it)."""
        return _PauseStop(self, pause_epoch)


class _PauseStop:
    def __init__(self, rank: ElasticRank, pause_epoch: int) -> None:
        self.rank = rank
        self.pause_epoch = pause_epoch

    def is_set(self) -> bool:
        rank = self.rank
        if rank.replica._stop.is_set():
            return True
        rank._beat()
        gather = rank.gather
        if gather is not None and joiners(rank.store, gather.epoch):
            gather.note_joiner()
            rank.replica._wake.wake(self.pause_epoch)
            return True
        return False
