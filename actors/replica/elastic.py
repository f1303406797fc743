"""A rank's elastic membership: its seat, its group's epochs, and what a re-form resets.

With ``elastic_dp`` the rank replicas are not a Serve gang, so Serve replaces a dead replica
by itself and the others keep running. A replica takes a seat (its group and ``dp_rank``),
loads its model, then starts its group or is admitted to it (``elastic_member``); its rounds
gather through ``ElasticGather``, which re-forms the group when a member dies or hangs and
admits a joiner at a round boundary. On every new epoch the membership resets what depends on
the group: the idle pause gets the new group's wake channel, the epoch's rank 0 frees the seats
of members that left (so their replacements can take them), and the rank hears of it
(``on_regroup``): its prefill policy starts over on the new group's rows (the gate's counter
restarts; round 0 is an ALL point).

A MoE model's experts are sharded over the group (expert parallelism): its runner loads its
seat's shard, and every epoch re-homes the experts over the members (``regroup_experts``:
what a lost member held comes from a surviving copy or the model's files; a joiner's slots
fill from the members), before the epoch's first forward.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

from roundgate.actors.control.executor import Executor
from roundgate.actors.control.gather import Gather
from roundgate.actors.replica import seats
from roundgate.actors.replica.elastic_forward import ElasticForward
from roundgate.actors.replica.elastic_gather import ElasticGather
from roundgate.actors.replica.elastic_member import ElasticSpec, enter, group_id
from roundgate.actors.replica.epoch_group import form_group
from roundgate.actors.replica.group_wake import GroupPause, open_group_wake
from roundgate.actors.replica.membership import Epoch, RayKvStore, joiners
from roundgate.actors.replica.node import device_type, multinode_host, node_id
from roundgate.actors.replica.outbox import RoundOutbox, SendAfterGather
from roundgate.actors.replica.rank_parts import OnRegroup
from roundgate.actors.server_args import ServerArgs

if TYPE_CHECKING:
    from roundgate.actors.model.runner import ModelRunner

# A seat whose holder has not said it is alive for this long is free to take.
STALE_S = 30.0
BEAT_S = 1.0


class ElasticMembership:
    """``RankMembership`` of an elastic rank (``elastic_dp``): a seat, and a group that
    re-forms around a dead member and admits joiners at a round boundary."""

    def __init__(self, spec: ElasticSpec, args: ServerArgs, me: str, seat: seats.Seat) -> None:
        self.spec = spec
        self.args = args
        self.me = me  # this replica's stable member id
        self.seat = seat
        self.rank = seat.dp_rank
        self.gang_id = group_id(spec, seat.group)
        self.store = RayKvStore()
        self.device = device_type(args.device)
        self.backend = "nccl" if self.device == "cuda" else "gloo"
        self.gather: ElasticGather | None = None  # set when the rank enters its group
        self.pauses: GroupPause | None = None  # the current epoch's pauses
        self._world_size = args.dp_size  # the full group until it forms
        self._row_rank = 0  # its place in the rows: set when it enters its group
        self._on_regroup: OnRegroup = lambda row_rank, world_size, reason: None
        self._last_beat = 0.0
        self._members: set[str] = set()  # the last epoch's, to tell who departed

    @classmethod
    async def take_seat(cls, spec: ElasticSpec, args: ServerArgs) -> ElasticMembership:
        """This replica's seat (its group and dp_rank), claimed in the rendezvous store."""
        from ray import serve

        me = str(serve.get_replica_context().replica_id.unique_id)
        seat = await asyncio.to_thread(
            seats.claim,
            RayKvStore(),
            spec.deployment,
            spec.num_groups,
            args.dp_size,
            me,
            STALE_S,
            await asyncio.to_thread(node_id) if spec.spread else None,
        )
        return cls(spec, args, me, seat)

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def row_rank(self) -> int:
        return self._row_rank

    @property
    def epoch(self) -> int | None:
        return None if self.gather is None else self.gather.epoch.number

    def build_runner(self, args: ServerArgs) -> ModelRunner:
        """The model runner, loaded before the group forms: a dense model is a group of one
        as far as the model knows; a MoE model loads its seat's shard of the experts and
        re-homes them at every epoch (``RankEngine.regroup``)."""
        from roundgate.actors.model.runner import DeferredGroup, ModelRunner

        if args.model_config.is_moe and args.dp_size > 1:
            return ModelRunner(args, rank=self.seat.dp_rank, group=DeferredGroup())
        return ModelRunner(args, rank=0, group=None)

    def executor(self, runner: ModelRunner) -> Executor:
        """What runs the rounds: a MoE runner wrapped so that a member lost mid-forward
        re-forms the group (``ElasticForward``); a dense runner as it is (its only collective
        is the gather, which re-forms by itself)."""
        if not (self.args.model_config.is_moe and self.args.dp_size > 1):
            return runner
        return ElasticForward(runner, self._reform_mid_round)

    def _reform_mid_round(self) -> None:
        assert self.gather is not None
        self.gather.reform("fault")

    async def enter(self, outbox: RoundOutbox, on_regroup: OnRegroup) -> Gather:
        """Start the seat's group or be admitted to it, then form its process group."""
        from roundgate.actors.replica.torch_gather import TorchGather

        timeout = self.args.collective_timeout_s
        host = await asyncio.to_thread(multinode_host)
        # Members admit a joiner at a round boundary, or within a second when idle.
        admit_s = max(60.0, 3 * timeout)
        epoch = await asyncio.to_thread(enter, self.store, self.spec, self.seat, self.me, admit_s)
        meeting = await asyncio.to_thread(
            form_group, self.store, epoch, self.backend, timeout, host
        )
        device = self.device
        self.gather = ElasticGather(
            self.store,
            epoch,
            self.backend,
            timeout,
            self.spec.window_s,
            lambda: TorchGather(device=device),
            on_reform=self._apply,
            poll_s=BEAT_S,
            host=host,
            on_poll=self._gathering_beat,
            meeting=meeting,
        )
        self._on_regroup = on_regroup
        self._apply(epoch, None)
        return SendAfterGather(self.gather, outbox)

    def _apply(self, epoch: Epoch, reason: str | None) -> None:
        """What a new epoch resets (on the engine thread, or before rounds start)."""
        assert self.gather is not None
        channel = open_group_wake(
            self.gather.meeting,
            f"{epoch.group}-e{epoch.number}",
            epoch.rank,
            epoch.world_size,
        )
        if self.pauses is None:
            self.pauses = GroupPause(channel)
        else:
            self.pauses.replace(channel)  # the new group counts pauses afresh
        self._world_size, self._row_rank = epoch.world_size, epoch.rank
        self._on_regroup(epoch.rank, epoch.world_size, reason)
        departed, self._members = self._members - set(epoch.members), set(epoch.members)
        if epoch.rank == 0 and departed:
            seats.release_departed(
                self.store, self.spec.deployment, self.seat.group, self.args.dp_size, departed
            )

    def pause(self, wake_now: bool, stop: threading.Event) -> None:
        """The idle pause; each second it also beats, and ends when a joiner waits (the
        whole group then wakes, and its next gather admits the joiner)."""
        assert self.pauses is not None
        self.pauses.pause(wake_now, lambda epoch: _PauseStop(self, stop, epoch))

    def wake(self) -> None:
        if self.pauses is not None:
            self.pauses.wake()

    def close(self) -> None:
        if self.pauses is not None:
            self.pauses.close()

    def beat(self, reclaim: bool = False) -> None:
        """Say this member is alive (at most every ``BEAT_S``); ``reclaim``: take its seat
        back if it was freed under it."""
        now = time.monotonic()
        if now - self._last_beat >= BEAT_S:
            self._last_beat = now
            seat = self.seat if reclaim else None
            seats.beat(self.store, self.spec.deployment, self.me, seat=seat)

    def _gathering_beat(self) -> None:
        """The beat of a member that is gathering rounds in the current epoch: it is in the
        group, so a seat freed under it is taken back (a paused member may have been left
        out of an epoch it slept through, and must not)."""
        self.beat(reclaim=True)

    def joiner_waiting(self, pause_epoch: int) -> bool:
        """Whether a joiner waits for the next epoch; if so the gather flags it and pause
        ``pause_epoch`` ends on every rank."""
        gather = self.gather
        if gather is None or not joiners(self.store, gather.epoch):
            return False
        gather.note_joiner()
        assert self.pauses is not None
        self.pauses.wake_epoch(pause_epoch)
        return True


class _PauseStop:
    """What the idle pause checks each second: the replica stopping, or a joiner waiting."""

    def __init__(self, member: ElasticMembership, stop: threading.Event, pause_epoch: int):
        self.member = member
        self.stop = stop
        self.pause_epoch = pause_epoch

    def is_set(self) -> bool:
        if self.stop.is_set():
            return True
        self.member.beat()
        return self.member.joiner_waiting(self.pause_epoch)
