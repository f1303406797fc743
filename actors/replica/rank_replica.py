"""The Ray Serve shell of one rank: a gang member that owns its engine thread.

One DP group is one Serve gang of ``dp_size`` replicas; each replica reads its rank from the
gang context, joins the group's process group, and runs ``EngineCore.step`` in a thread of
its own so blocking collectives never stall the replica's asyncio loop. ``generate`` is a
streaming method: tokens flow from the engine thread into a per-request asyncio queue.

The engine thread also builds the engine (model load included): every torch kernel of the
rank then runs on that one thread. libgomp keeps a pool of worker threads per thread that
opens a parallel region, and once its pools hold more threads than the process has CPUs it
stops letting idle workers spin between regions (its "throttled" spin: ~100 iterations
instead of ~3 ms): each of the hundreds of parallel regions of a decode step then waits for
a futex wake-up. A build in an executor thread that stays alive left a second pool, and a
two-thread rank decoded at 60% of the speed of the same engine run on one thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.messages import GenerateChunk, GenerateRequest, RankTarget, Usage
from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.control.request import Request
from roundgate.actors.control.round import TokenEvent
from roundgate.actors.replica.chunks import ChunkBuilder
from roundgate.actors.replica.elastic import ElasticRank
from roundgate.actors.replica.elastic_member import ElasticSpec
from roundgate.actors.replica.group_wake import STOP_CHECK_S, open_group_wake
from roundgate.actors.replica.kv_sender import KvEventSender
from roundgate.actors.replica.node import device_type, multinode_host, node_id
from roundgate.actors.replica.outbox import RoundOutbox, SendAfterGather
from roundgate.actors.server_args import ServerArgs
from roundgate.actors.telemetry import gate_log
from roundgate.actors.telemetry.gate_log import log_gate_window
from roundgate.actors.telemetry.metrics_hub import Pusher, snapshot
from roundgate.actors.telemetry.rank_metrics import RankMetrics
from roundgate.actors.telemetry.rank_stats import RankStats

logger = logging.getLogger("roundgate.rank")


class GroupFailure(RuntimeError):
    """The DP group can no longer run rounds (a peer died or a collective timed out)."""


class GroupUnavailable(GroupFailure):
    """This rank's group had failed before the request arrived: it never ran here (the
    ingress resubmits it without charging it a rank failure, ``roundgate.deployment.resume``)."""


class RankReplica:
    """One attention-DP rank: model shard, KV pool, scheduler and gate, on one device."""

    async def __init__(self, args: dict[str, Any], elastic: dict[str, Any] | None = None) -> None:
        from ray import serve

        from roundgate.actors.replica import rendezvous

        self.args = ServerArgs(**args)  # validated here, once for this process
        _limit_threads()
        timeout = self.args.collective_timeout_s
        device = device_type(self.args.device)
        backend = self._backend = "nccl" if device == "cuda" else "gloo"
        # Elastic DP (``roundgate.actors.replica.elastic``): no gang; the group forms after the
        # model loads, and re-forms around a dead member instead of restarting.
        self.elastic = ElasticRank(ElasticSpec(**elastic), self) if elastic else None
        if self.elastic is not None:
            self.rank, self.world_size, self.gang_id = await self.elastic.take_seat()
            self.row_rank = 0  # its place in the rows: set when it enters its group
            self._wake = None
        else:
            gang = serve.get_replica_context().gang_context
            if gang is None:
                raise RuntimeError("RankReplica needs gang scheduling (gang_scheduling_config)")
            self.rank, self.world_size, self.gang_id = gang.rank, gang.world_size, gang.gang_id
            self.row_rank = self.rank  # its place in the gathered rows
            if self.world_size != self.args.dp_size:
                raise ValueError(
                    f"gang of {self.world_size} replicas but --dp-size {self.args.dp_size}"
                )
            if self.rank == 0:
                meeting = rendezvous.choose_meeting(self.gang_id, backend, multinode_host())
                rendezvous.publish(self.gang_id, meeting)
            else:
                meeting = await asyncio.to_thread(rendezvous.lookup, self.gang_id, timeout)
            await asyncio.to_thread(rendezvous.join, meeting, self.rank, self.world_size, timeout)
            self._wake = open_group_wake(
                meeting.init_method, self.gang_id, self.rank, self.world_size
            )
        # The epoch of the group pause this rank is in (None while running rounds), and the
        # last one a request woke: read and written by the engine thread and the event loop.
        self._pause_epoch = 0
        self._paused_at: int | None = None
        self._woken = -1
        self._loop = asyncio.get_running_loop()
        self._streams: dict[str, asyncio.Queue] = {}
        # The engine thread's deliveries to the streams, one hand-off a round (outbox.py).
        self._outbox = RoundOutbox(self._loop)
        self.stats = RankStats()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._serving = threading.Event()  # set when this replica is ready: rounds may start
        built: Future[EngineCore] = Future()
        self._thread = threading.Thread(
            target=self._engine, args=(device, built), name=f"rank{self.rank}", daemon=True
        )
        self._thread.start()
        self.core = await asyncio.wrap_future(built)
        # The kv routers' channel: this rank's pool changes and load (None: not asked for).
        self.kv_events = (
            KvEventSender(str(serve.get_replica_context().replica_id), self.core.scheduler)
            if self.args.publish_kv_events
            else None
        )
        self._grammars = self._runner.grammars
        # One worker: compiles queue rather than take CPU from the rounds.
        self._grammar_worker = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        model = self.metrics_model = os.path.basename(self.args.model.rstrip("/"))
        self.metrics = RankMetrics(self.gang_id, model, self.rank)
        self.metrics.note_weight_path(self._runner.weight_path)
        self.metrics.note_prefill_policy(self.args.prefill_policy_name)
        self._pusher = Pusher(
            f"rank:{self.gang_id}:{self.rank}",
            lambda: snapshot(self.metrics.set.registry),
            version=lambda: self.stats.rounds,
        )
        if self.elastic is not None:
            # Loaded: now start the group, or wait to be admitted to the running one.
            await self.elastic.enter()
        self._serving.set()
        logger.info("rank %d/%d of gang %s ready", self.rank, self.world_size, self.gang_id)

    def _build_core(self, device: str) -> EngineCore:
        import torch.distributed as dist

        from roundgate.actors.control.gather import SingleRankGather
        from roundgate.actors.model.runner import ModelRunner
        from roundgate.actors.replica.torch_gather import TorchGather

        if self.elastic is not None:
            runner = self._runner = self.elastic.build_runner(ModelRunner)
            # The gather is set when the rank enters its group (``ElasticRank.enter``).
            return EngineCore(
                self.args, runner, rank=self.rank, gather=None, on_event=self._on_event
            )
        runner = self._runner = ModelRunner(self.args, rank=self.rank, group=dist.group.WORLD)
        # A group of one gathers its own row: no collective per round.
        if self.world_size > 1:
            gather = SendAfterGather(TorchGather(device=device), self._outbox)
        else:
            gather = SingleRankGather()
        return EngineCore(self.args, runner, rank=self.rank, gather=gather, on_event=self._on_event)

    # ---- engine thread -------------------------------------------------------------------

    def _engine(self, device: str, built: Future[EngineCore]) -> None:
        """Build the engine, hand it to ``__init__``, then run rounds once the replica is
        ready: one thread for all of the rank's torch work (the module docstring says why)."""
        try:
            core = self._build_core(device)
        except BaseException as exc:
            built.set_exception(exc)
            return
        built.set_result(core)
        self._serving.wait()
        self._run()

    def _run(self) -> None:
        # Group-level: rank 0 speaks for the group (every rank saw the same window).
        log_windows = self.args.log_gate_windows and self.rank == 0
        if log_windows:
            gate_log.enable()
        try:
            while not self._stop.is_set():
                outcome = self.core.step()
                self.stats.observe(outcome)
                if log_windows:
                    log_gate_window(outcome, self.stats.rounds, self.gang_id)
                self.metrics.observe(
                    outcome,
                    self.core.scheduler,
                    self.core.loop.parts,
                    self.core.loop.policy.rounds_since_prefill,
                )
                if self.kv_events is not None:
                    since = self.core.loop.policy.rounds_since_prefill
                    self.kv_events.after_round(since)
                    if outcome.view.all_idle:
                        self.kv_events.flush(since)
                self._after_round(outcome)
                if outcome.view.all_idle:
                    self._outbox.send()
                    self._pause()
                else:  # alone with work: held for the next gather (outbox.py says why)
                    self._outbox.end_round(outcome.rows, self.row_rank)
            self._outbox.send()
        except BaseException as exc:  # a dead peer or a timed-out collective ends the group
            self._error = GroupFailure(f"rank {self.rank}: DP group failed: {exc}")
            logger.error("%s", self._error, exc_info=exc)
            self._outbox.send()  # the tokens made before the failure, then the error
            self._loop.call_soon_threadsafe(self._fail_all, self._error)

    def _after_round(self, outcome: RoundOutcome) -> None:
        """A role's own use of a round's outcome (on the engine thread): P/D handoffs and
        reservations (``prefill_replica``, ``decode_replica``); nothing for a fused rank."""

    def _pause(self) -> None:
        """Sleep with the whole group until a request arrives on any rank.

        Every rank sees the same idle rows and pauses on the same round, so the epochs agree.
        ``_paused_at`` is set before the intake is looked at: a request submitted after that
        look finds the epoch and wakes it (``_wake_group``); one submitted before is seen here.
        """
        self._pause_epoch += 1
        epoch = self._paused_at = self._pause_epoch
        try:
            # A decode rank whose every request waits for its KV blocks too: the transfer's
            # end (kv_arrived / kv_failed) wakes it.
            if self.core.has_local_work and not self.core.waits_on_transfers:
                self._wake.wake(epoch)
            stop = self._stop if self.elastic is None else self.elastic.pause_stop(epoch)
            self._wake.wait(epoch, stop)
        finally:
            self._paused_at = None

    def _wake_group(self) -> None:
        """A request was queued on this rank: end the group's pause, if it is in one."""
        epoch = self._paused_at
        if epoch is not None and epoch != self._woken:
            self._woken = epoch
            self._wake.wake(epoch)

    def _on_event(self, event: TokenEvent) -> None:
        request = event.request
        queue = self._streams.get(request.stream_id or request.request_id)
        if queue is not None:
            self._outbox.put(queue, event)

    def _fail_all(self, error: BaseException) -> None:
        for queue in self._streams.values():
            queue.put_nowait(error)

    # ---- Serve methods -------------------------------------------------------------------

    async def generate(self, message: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Stream the request's new tokens, ``stream_interval`` or more per chunk."""
        async for chunk in self._generate(message.to_request()):
            yield chunk

    async def _generate(self, request: Request, until: type | None = None) -> AsyncIterator[Any]:
        """Submit ``request`` and relay its chunks (``_relay``; ``until``: an item type that
        ends the relay, e.g. a prefill rank's ``Handoff``)."""
        if self._error is not None:
            raise GroupUnavailable(str(self._error))
        request_id = request.request_id
        if request_id in self._streams:
            # Its events would reach the live stream of that id: refuse this one alone.
            usage = Usage(prompt_tokens=request.num_prompt_tokens, completion_tokens=0)
            error = f"request id {request_id!r} is already streaming on this rank"
            yield GenerateChunk(token_ids=(), finish_reason="error", usage=usage, error=error)
            return
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = queue
        finished = False
        builder: ChunkBuilder | None = None
        try:
            grammar = request.sampling.grammar
            loading = grammar is not None and not self._grammars.is_compiled(grammar)
            submitted = False
            try:
                self.core.submit(request, loading=loading)
                submitted = True
                if loading:
                    await self._compile(grammar)
            except ValueError as exc:  # this request cannot run here; the group is fine
                finished = True
                if submitted:  # its grammar failed: take back what waits in LOADING
                    self.core.abort(request_id)
                yield GenerateChunk(
                    token_ids=(),
                    finish_reason="error",
                    usage=Usage(prompt_tokens=request.num_prompt_tokens, completion_tokens=0),
                    error=str(exc),
                )
                return
            if loading:
                self.core.mark_loaded(request_id)
            self._wake_group()
            self.metrics.note_arrival(request_id)
            builder = ChunkBuilder(request, self.args.stream_interval)
            async for chunk in self._relay(builder, queue, until):
                yield chunk
            finished = True
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                # The caller went away (or the group failed): free the request's pages.
                for sequence in builder.unfinished_ids() if builder else [request_id]:
                    self.core.abort(sequence)

    async def _relay(
        self, builder: ChunkBuilder, queue: asyncio.Queue, until: type | None = None
    ) -> AsyncIterator[Any]:
        """The request's events from ``queue`` as chunks, until every sequence ended (or an
        item of type ``until`` arrives: yielded as it is, and the relay stops)."""
        while not builder.done:
            # Whatever queued up while we were away goes out in one chunk: under load
            # that batches tokens; ``stream_interval`` sets the minimum chunk size.
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            for item in items:
                if isinstance(item, BaseException):
                    raise item
                if until is not None and isinstance(item, until):
                    for chunk in builder.take():
                        yield chunk
                    yield item
                    return
                builder.add(item)
            for chunk in builder.take():
                yield chunk

    async def _compile(self, grammar: tuple[str, str]) -> None:
        """Compile ``grammar`` on the grammar worker, within ``--max-grammar-compile-s``; a
        ValueError (this request's 400) when it does not compile or takes too long.

        The request waits in the scheduler's ``LOADING`` state meanwhile, so the rank keeps
        running rounds for everyone else. A compile past the limit still runs to its end on
        the worker (a thread cannot be stopped); later compiles queue behind it, which is why
        the ingress bounds a grammar's size before it gets here.
        """
        limit = self.args.max_grammar_compile_s
        future = self._loop.run_in_executor(self._grammar_worker, self._grammars.compile, grammar)
        try:
            await asyncio.wait_for(asyncio.shield(future), limit)
        except TimeoutError:
            raise ValueError(
                f"{grammar[0]}: the grammar did not compile within {limit:g} s "
                "(--max-grammar-compile-s)"
            ) from None

    async def stats_snapshot(self, target: RankTarget | None = None) -> dict[str, Any]:
        """Queue, pool and gate counters; ``target`` only steers routing."""
        sched = self.core.scheduler
        return {
            "dp_rank": self.rank,
            "pid": os.getpid(),
            "node_id": node_id(),
            "gang_id": self.gang_id,
            "actor_name": _actor_name(),
            "waiting": len(sched.queues.waiting),
            "running": len(sched.queues.running),
            "retracted": len(sched.queues.retracted),
            "kv_occupancy": sched.pool.occupancy,
            "retractions": sched.num_retractions,
            "aborts": sched.num_aborts,
            "rounds_since_prefill": self.core.loop.policy.rounds_since_prefill,
            "prefix_queries": sched.prefix.num_queries,  # prompt tokens looked up, and found
            "prefix_hits": sched.prefix.num_hits,
            "error": None if self._error is None else str(self._error),
            # Elastic DP: the group as this rank's last re-form left it (else the gang's).
            "group_size": self.world_size,
            "epoch": None
            if self.elastic is None or self.elastic.gather is None
            else self.elastic.gather.epoch.number,
            **self.stats.snapshot(),
        }

    async def check_pool(self, target: RankTarget | None = None) -> bool:
        """Pool integrity (for tests and operators); raises ``AssertionError`` if broken."""
        self.core.scheduler.pool.check_integrity()
        return True

    def record_replica_metadata(self) -> dict[str, Any]:
        """Static identity for the routers (sent once, when the replica becomes ready)."""
        return {"dp_rank": self.rank, "gang_id": self.gang_id}

    def record_routing_stats(self) -> dict[str, Any]:
        sched = self.core.scheduler
        return {
            "dp_rank": self.rank,
            "gang_id": self.gang_id,
            "load": len(sched.queues.requests),
            "kv_occupancy": sched.pool.occupancy,
        }

    def check_health(self) -> None:
        if self._error is not None:
            raise self._error
        if not self._thread.is_alive():
            raise GroupFailure(f"rank {self.rank}: engine thread exited")

    def __del__(self) -> None:
        if hasattr(self, "_stop"):
            self._stop.set()
            self._serving.set()  # a thread still waiting to start sees the stop and ends
        if hasattr(self, "_thread"):
            self._thread.join(timeout=2 * STOP_CHECK_S)
        if getattr(self, "_wake", None) is not None:
            self._wake.close()
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
