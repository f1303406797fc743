"""A rank's engine thread, and the request streams it feeds.

The engine thread builds the engine (model load included) and then runs its rounds: every
torch kernel of the rank runs on that one thread. libgomp keeps a pool of worker threads per
thread that opens a parallel region, and once its pools hold more threads than the process
has CPUs it stops letting idle workers spin between regions (its "throttled" spin: ~100
iterations instead of ~3 ms): each of the hundreds of parallel regions of a decode step then
waits for a futex wake-up. A build in an executor thread that stays alive left a second pool,
and a two-thread rank decoded at 60% of the speed of the same engine run on one thread.

Rounds run in that thread so blocking collectives never stall the replica's asyncio loop.
What a round produces for the request streams (token events, a role's handoffs or
reservations) goes through the round's outbox (``outbox``) to one ``asyncio.Queue`` per
request, opened by the role that submitted it (``open_stream``).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.gather import Gather
from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.control.round import TokenEvent
from roundgate.actors.replica.group_wake import STOP_CHECK_S
from roundgate.actors.replica.outbox import RoundOutbox
from roundgate.actors.replica.rank_parts import RankMembership
from roundgate.actors.server_args import ServerArgs

if TYPE_CHECKING:
    from roundgate.actors.model.expert_rehome import RehomeReport
    from roundgate.actors.model.runner import ModelRunner

logger = logging.getLogger("roundgate.rank")
T = TypeVar("T")


class GroupFailure(RuntimeError):
    """The DP group can no longer run rounds (a peer died or a collective timed out)."""


class GroupUnavailable(GroupFailure):
    """This rank's group had failed before the request arrived: it never ran here (the
    ingress resubmits it without charging it a rank failure, ``roundgate.deployment.resume``)."""


class RankEngine:
    """The engine thread of one rank: builds the ``EngineCore``, runs its rounds (pausing
    with the group through ``membership`` when every rank is idle), and delivers what the
    rounds produce to the request streams.

    ``build`` (event loop) starts the thread, which loads the model and waits; ``start`` lets
    the rounds run, each handed to ``after_round`` on the engine thread."""

    def __init__(self, args: ServerArgs, membership: RankMembership) -> None:
        self.args = args
        self.membership = membership
        self.loop = asyncio.get_running_loop()
        # The engine thread's deliveries to the streams, one hand-off a round (outbox.py).
        self.outbox = RoundOutbox(self.loop)
        self.streams: dict[str, asyncio.Queue] = {}
        self.core: EngineCore | None = None
        self.runner: ModelRunner | None = None
        self.rehome: RehomeReport | None = None  # the last epoch's expert re-home (MoE)
        self._after_round: Callable[[RoundOutcome], None] = lambda outcome: None
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._serving = threading.Event()  # set when the replica is ready: rounds may start
        self._thread: threading.Thread | None = None
        # Work for the engine thread before the rounds start (``on_engine_thread``).
        self._jobs: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()

    async def build(self) -> EngineCore:
        """Start the engine thread and wait while it builds the engine (rounds wait for
        ``start``)."""
        built: Future[EngineCore] = Future()
        self._thread = threading.Thread(
            target=self._engine, args=(built,), name=f"rank{self.membership.rank}", daemon=True
        )
        self._thread.start()
        self.core = await asyncio.wrap_future(built)
        return self.core

    def use_gather(self, gather: Gather) -> None:
        """The gather the rounds run through (the membership's, once it entered its group)."""
        self.core.loop.gather = gather

    def regroup(self, row_rank: int, world_size: int) -> None:
        """A new membership (elastic DP; engine thread, or before rounds start): the prefill
        policy starts over on the new group's rows."""
        from roundgate.gate import registry
        from roundgate.gate.spec import PolicyContext

        args = self.args
        spec = registry.get(args.prefill_policy_name)
        context = PolicyContext(row_rank, world_size, args.max_batch_size)
        self.core.loop.regroup(spec.build(args.policy_config, context), world_size)
        if args.model_config.is_moe and args.dp_size > 1:  # experts onto the new members
            self.rehome = self.on_engine_thread(
                lambda: self.runner.regroup_experts(row_rank, world_size)
            )
            logger.info(
                "rank %d: experts re-homed over %d members in %.3f s (%d transferred, %d read "
                "from the model's files)",
                self.membership.rank,
                world_size,
                self.rehome.seconds,
                self.rehome.experts_transferred,
                self.rehome.experts_loaded,
            )

    def on_engine_thread(self, job: Callable[[], T]) -> T:
        """Run ``job`` on the engine thread and return its result: at once when called there
        (a re-form inside a round), else handed to the thread while it waits for ``start``
        (a group's first epoch, formed on the event loop). Torch work stays on the one
        thread (the module docstring says why); the caller waits, as for any collective."""
        here = threading.current_thread() is self._thread
        if here or self._thread is None or self._serving.is_set():  # (nobody would take it)
            return job()
        done: Future[T] = Future()
        self._jobs.put((job, done))
        return done.result()

    def start(self, after_round: Callable[[RoundOutcome], None]) -> None:
        """Let the rounds run; ``after_round`` sees each outcome on the engine thread."""
        self._after_round = after_round
        self._serving.set()

    # ---- the engine thread ---------------------------------------------------------------

    def _engine(self, built: Future[EngineCore]) -> None:
        """Build the engine, hand it to ``build``, then run rounds once the replica is ready:
        one thread for all of the rank's torch work (the module docstring says why)."""
        try:
            self.runner = self.membership.build_runner(self.args)
            core = EngineCore(
                # The runner's args: under --gpu-memory-utilization it sized the KV pool
                # after the weights, and the scheduler must hand out those pages, no others.
                self.runner.args,
                self.membership.executor(self.runner),
                rank=self.membership.rank,
                gather=None,  # the membership's, set before rounds start (``use_gather``)
                on_event=self.on_event,
            )
        except BaseException as exc:
            built.set_exception(exc)
            return
        built.set_result(core)
        while not self._serving.is_set():  # jobs for this thread until the rounds start
            try:
                job, done = self._jobs.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                done.set_result(job())
            except BaseException as exc:
                done.set_exception(exc)
        self._run(core)

    def _run(self, core: EngineCore) -> None:
        try:
            while not self._stop.is_set():
                outcome = core.step()
                self._after_round(outcome)
                if outcome.view.all_idle:
                    self.outbox.send()
                    # A decode rank whose every request waits for its KV blocks too: the
                    # transfer's end (kv_arrived / kv_failed) wakes it.
                    wake_now = core.has_local_work and not core.waits_on_transfers
                    self.membership.pause(wake_now, self._stop)
                else:  # alone with work: held for the next gather (outbox.py says why)
                    self.outbox.end_round(outcome.rows, self.membership.row_rank)
            self.outbox.send()
        except BaseException as exc:  # a dead peer or a timed-out collective ends the group
            logger.error("rank %d: DP group failed", self.membership.rank, exc_info=exc)
            self.fail(exc)

    def fail(self, cause: BaseException) -> None:
        """End the group for this rank (any thread): the streams get a ``GroupFailure`` after
        what the rounds made before it, and new requests are refused (``check_serving``)."""
        self._error = GroupFailure(f"rank {self.membership.rank}: DP group failed: {cause}")
        self.outbox.send()  # the tokens made before the failure, then the error
        self.loop.call_soon_threadsafe(self._fail_all, self._error)

    def on_event(self, event: TokenEvent) -> None:
        """The core's event sink (engine thread): the event to its request's stream."""
        request = event.request
        self.deliver(request.stream_id or request.request_id, event)

    def _fail_all(self, error: BaseException) -> None:
        for stream in self.streams.values():
            stream.put_nowait(error)

    # ---- the request streams ---------------------------------------------------------------

    def deliver(self, stream_id: str, item: Any) -> bool:
        """Queue ``item`` for stream ``stream_id`` in this round's hand-off (engine thread);
        False when no such stream is open (its caller went away)."""
        queue = self.streams.get(stream_id)
        if queue is None:
            return False
        self.outbox.put(queue, item)
        return True

    def open_stream(self, request_id: str) -> asyncio.Queue | None:
        """The new stream of ``request_id``; None when one is open already (its events would
        reach the live stream of that id)."""
        if request_id in self.streams:
            return None
        queue: asyncio.Queue = asyncio.Queue()
        self.streams[request_id] = queue
        return queue

    def close_stream(self, request_id: str) -> None:
        self.streams.pop(request_id, None)

    @property
    def error(self) -> BaseException | None:
        """Why the group failed (``GroupFailure``), or None while it runs."""
        return self._error

    def check_serving(self) -> None:
        """Refuse a new request on a failed group (``GroupUnavailable``: it never ran here)."""
        if self._error is not None:
            raise GroupUnavailable(str(self._error))

    def check_health(self) -> None:
        if self._error is not None:
            raise self._error
        if self._thread is None or not self._thread.is_alive():
            raise GroupFailure(f"rank {self.membership.rank}: engine thread exited")

    def stop(self) -> None:
        """End the rounds (a paused thread sees the stop within ``STOP_CHECK_S``)."""
        self._stop.set()
        self._serving.set()  # a thread still waiting to start sees the stop and ends
        if self._thread is not None:
            self._thread.join(timeout=2 * STOP_CHECK_S)
