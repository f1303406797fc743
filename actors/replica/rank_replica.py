"""The Ray Serve shell of one rank: a membership and a role around one engine thread.

One rank replica is one attention-DP rank. The shell composes three parts it owns and wires
them together through their public methods (``rank_parts`` documents the interfaces):

- its **membership** (``GangMembership``: a Serve gang, restarted whole; ``ElasticMembership``:
  a seat in a group that re-forms around a dead member) says who the rank is in its group and
  how the group gathers, pauses and wakes;
- its **engine** (``RankEngine``) runs ``EngineCore.step`` on a thread of its own (every torch
  kernel of the rank on that thread: ``rank_engine`` says why), pausing through the membership,
  and delivers what the rounds produce to the request streams;
- its **role** (``FusedRole``, ``PrefillRole``, ``DecodeRole``, by ``--disaggregation-mode``)
  takes the requests and uses each round's outcome.

The Serve methods are the shell's; those of one role (``generate``: fused; ``prefill``,
``send_kv``, ``release_handoff``, ``inject_transfer_faults``: prefill; ``decode``: decode) go to
the role, and raise ``RoleMismatch`` naming this rank's role on any other. One class serves
every deployment: ``RankReplica`` (fused), and P/D's ``PrefillRank`` and ``DecodeRank``
(``roundgate.deployment.pd_app``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from roundgate.actors.control.messages import GenerateChunk, GenerateRequest, RankTarget
from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.replica.decode_role import DecodeRole
from roundgate.actors.replica.elastic import ElasticMembership
from roundgate.actors.replica.elastic_member import ElasticSpec
from roundgate.actors.replica.fused_role import FusedRole
from roundgate.actors.replica.gang_membership import GangMembership
from roundgate.actors.replica.intake import PromptIntake
from roundgate.actors.replica.kv_sender import KvEventSender
from roundgate.actors.replica.node import node_id
from roundgate.actors.replica.pd_messages import (
    DecodeRequest,
    LinkSpec,
    PrefillResult,
    ReleaseHandoff,
    SendKV,
    TransferReport,
)
from roundgate.actors.replica.prefill_role import PrefillRole
from roundgate.actors.replica.rank_engine import RankEngine
from roundgate.actors.replica.rank_parts import RankMembership, RankRole, served_by
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.server_args import ServerArgs
from roundgate.actors.telemetry import gate_log
from roundgate.actors.telemetry.gate_log import log_gate_window
from roundgate.actors.telemetry.metrics_hub import Pusher, snapshot
from roundgate.actors.telemetry.rank_metrics import RankMetrics
from roundgate.actors.telemetry.rank_stats import RankStats
from roundgate.actors.telemetry.transfer_metrics import TransferMetrics

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

logger = logging.getLogger("roundgate.rank")


class RankReplica:
    """One attention-DP rank: model shard, KV pool, scheduler and gate, on one device.

    ``args``: the rank's ``ServerArgs`` (or their dict); ``elastic``: an ``ElasticSpec`` (or
    its dict) for elastic DP, None for a gang; ``link`` (P/D): the link both roles join;
    ``prefill`` (a decode rank): the prefill role's deployment handle."""

    async def __init__(
        self,
        args: ServerArgs | dict[str, Any],
        elastic: ElasticSpec | dict[str, Any] | None = None,
        link: LinkSpec | None = None,
        prefill: DeploymentHandle | None = None,
    ) -> None:
        from ray import serve

        # Validated where it was built (or here, once for this process, from a dict).
        self.args = ServerArgs.of(args)
        _limit_threads()
        if isinstance(elastic, dict):
            elastic = ElasticSpec(**elastic)
        if elastic is not None and self.args.async_scheduling and self.args.model_config.is_moe:
            raise ValueError(
                "--async-scheduling is not supported with an elastic MoE group: a round its "
                "re-formed group runs again cannot be run again once its successor is queued"
            )
        # Elastic DP (``roundgate.actors.replica.elastic``): no gang; the group forms after
        # the model loads, and re-forms around a dead member instead of restarting.
        self.membership: RankMembership = (
            await ElasticMembership.take_seat(elastic, self.args)
            if elastic is not None
            else await GangMembership.join(self.args)
        )
        member = self.membership
        self.engine = RankEngine(self.args, member)
        core = await self.engine.build()
        # The kv routers' channel: this rank's pool changes and load (None: not asked for).
        self.kv_events = (
            KvEventSender(str(serve.get_replica_context().replica_id), core.scheduler)
            if self.args.publish_kv_events
            else None
        )
        self.metrics_model = os.path.basename(self.args.model.rstrip("/"))
        self.metrics = RankMetrics(member.gang_id, self.metrics_model, member.rank)
        self.metrics.note_weight_path(self.engine.runner.weight_path)
        self.metrics.note_prefill_policy(self.args.prefill_policy_name)
        self.stats = RankStats()
        self._pusher = Pusher(
            f"rank:{member.gang_id}:{member.rank}",
            lambda: snapshot(self.metrics.set.registry),
            version=lambda: self.stats.rounds,
        )
        self.role: RankRole = self._make_role(link, prefill)
        # Group-level: rank 0 speaks for the group (every rank saw the same window).
        self._log_windows = self.args.log_gate_windows and member.rank == 0
        if self._log_windows:
            gate_log.enable()
        # Loaded: now form the group (a gang's is formed) or wait to be admitted to it.
        self.engine.use_gather(await member.enter(self.engine.outbox, self._regrouped))
        self.engine.start(self._after_round)
        await self.role.start()
        logger.info("rank %d/%d of gang %s ready", member.rank, member.world_size, member.gang_id)

    def _make_role(self, link: LinkSpec | None, prefill: DeploymentHandle | None) -> RankRole:
        """The role ``--disaggregation-mode`` names, with what it needs."""
        mode = self.args.disaggregation_mode
        engine, wake = self.engine, self.membership.wake
        if mode is DisaggregationRole.FUSED:
            if link is not None:
                raise ValueError("a fused rank (--disaggregation-mode fused) joins no P/D link")
            return FusedRole(self._intake())
        if link is None:
            raise ValueError(f"a {mode} rank needs the P/D link (roundgate.deployment.pd_app)")
        member = self.membership
        transfers = TransferMetrics(
            self.metrics.set, member.gang_id, self.metrics_model, member.rank, mode
        )
        if mode is DisaggregationRole.PREFILL:
            return PrefillRole(engine, self._intake(), wake, transfers, link)
        if prefill is None:
            raise ValueError("a decode rank needs the prefill role's deployment handle")
        return DecodeRole(engine, wake, transfers, link, prefill)

    def _intake(self) -> PromptIntake:
        grammars = self.engine.runner.grammars
        return PromptIntake(self.engine, grammars, self.membership.wake, self.metrics.note_arrival)

    def _regrouped(self, row_rank: int, world_size: int, reason: str | None) -> None:
        """A (re)formed elastic group: the policy starts over on its rows, metrics note it."""
        self.engine.regroup(row_rank, world_size)
        self.metrics.note_group(world_size, reason, row_rank)
        if self.engine.rehome is not None:  # a MoE group: its experts re-homed
            self.metrics.note_rehome(self.engine.rehome)

    def _after_round(self, outcome: RoundOutcome) -> None:
        """What the rank makes of each round (the engine thread): stats, metrics, KV events,
        then the role's use of it."""
        core, gang_id = self.engine.core, self.membership.gang_id
        self.stats.observe(outcome)
        if self._log_windows:
            log_gate_window(outcome, self.stats.rounds, gang_id)
        self.metrics.observe(
            outcome, core.scheduler, core.loop.parts, core.loop.policy.rounds_since_prefill
        )
        balancer = self.engine.runner.balancer
        if balancer is not None:
            self.metrics.note_rebalance(balancer.last)
        if self.kv_events is not None:
            since = core.loop.policy.rounds_since_prefill
            self.kv_events.after_round(since)
            if outcome.view.all_idle:
                self.kv_events.flush(since)
        self.role.after_round(outcome)

    # ---- Serve methods of one role -------------------------------------------------------

    async def generate(self, message: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """A fused rank: stream the request's new tokens, ``stream_interval`` or more per
        chunk."""
        async for chunk in served_by(self.role, FusedRole, "generate").generate(message):
            yield chunk

    async def prefill(self, message: GenerateRequest) -> PrefillResult:
        """A prefill rank: the request's ``Handoff``, or its whole answer (``PrefillRole``)."""
        return await served_by(self.role, PrefillRole, "prefill").prefill(message)

    async def send_kv(self, order: SendKV) -> int:
        """A prefill rank: send a handoff's pages to the decode rank that reserved them."""
        return await served_by(self.role, PrefillRole, "send_kv").send_kv(order)

    async def release_handoff(self, order: ReleaseHandoff) -> None:
        """A prefill rank: unpin a handoff no decode rank will take (idempotent)."""
        await served_by(self.role, PrefillRole, "release_handoff").release_handoff(order)

    async def inject_transfer_faults(self, target: RankTarget, count: int) -> None:
        """A prefill rank: the next ``count`` sends report a failure (tests and drills)."""
        role = served_by(self.role, PrefillRole, "inject_transfer_faults")
        await role.inject_transfer_faults(target, count)

    async def decode(self, message: DecodeRequest) -> AsyncIterator[GenerateChunk | TransferReport]:
        """A decode rank: take the handoff, receive its KV, stream its tokens (first item:
        the transfer's report)."""
        async for item in served_by(self.role, DecodeRole, "decode").decode(message):
            yield item

    # ---- Serve methods of every rank -----------------------------------------------------

    async def stats_snapshot(self, target: RankTarget | None = None) -> dict[str, Any]:
        """Queue, pool and gate counters; ``target`` only steers routing."""
        core, member, error = self.engine.core, self.membership, self.engine.error
        sched = core.scheduler
        return {
            "dp_rank": member.rank,
            "pid": os.getpid(),
            "node_id": node_id(),
            "gang_id": member.gang_id,
            "actor_name": _actor_name(),
            "waiting": len(sched.queues.waiting),
            "running": len(sched.queues.running),
            "retracted": len(sched.queues.retracted),
            "kv_occupancy": sched.pool.occupancy,
            "retractions": sched.num_retractions,
            "aborts": sched.num_aborts,
            "rounds_since_prefill": core.loop.policy.rounds_since_prefill,
            "prefix_queries": sched.prefix.num_queries,  # prompt tokens looked up, and found
            "prefix_hits": sched.prefix.num_hits,
            "error": None if error is None else str(error),
            # Elastic DP: the group as this rank's last re-form left it (else the gang's).
            "group_size": member.world_size,
            "epoch": member.epoch,
            **self.stats.snapshot(),
        }

    async def check_pool(self, target: RankTarget | None = None) -> bool:
        """Pool integrity (for tests and operators); raises ``AssertionError`` if broken."""
        self.engine.core.scheduler.pool.check_integrity()
        return True

    def record_replica_metadata(self) -> dict[str, Any]:
        """Static identity for the routers (sent once, when the replica becomes ready)."""
        return {"dp_rank": self.membership.rank, "gang_id": self.membership.gang_id}

    def record_routing_stats(self) -> dict[str, Any]:
        sched = self.engine.core.scheduler
        return {
            "dp_rank": self.membership.rank,
            "gang_id": self.membership.gang_id,
            "load": len(sched.queues.requests),
            "kv_occupancy": sched.pool.occupancy,
        }

    def check_health(self) -> None:
        self.engine.check_health()

    def __del__(self) -> None:
        if hasattr(self, "engine"):
            self.engine.stop()
        if hasattr(self, "membership"):
            self.membership.close()
        if hasattr(self, "_pusher"):
            self._pusher.stop()
        if getattr(self, "kv_events", None) is not None:
            self.kv_events.leave()


def _actor_name() -> str | None:
    import ray

    return ray.get_runtime_context().get_actor_name()


def _limit_threads() -> None:
    """One torch thread per CPU Ray gave this rank, so co-located ranks don't oversubscribe;
    a fraction rounds up (1.75 CPUs: two threads, the ingress's quarter CPU beside them)."""
    import math

    import ray
    import torch

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    torch.set_num_threads(max(1, math.ceil(cpus - 1e-9)))
