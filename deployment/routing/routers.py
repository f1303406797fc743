"""Serve request routers that spread prompts over the ranks of the DP groups.

Each rank replica announces ``{"dp_rank", "gang_id"}`` once (``record_replica_metadata``)
and reports ``{"load", "kv_occupancy"}`` through ``record_routing_stats``. A call's message
(``GenerateRequest``, ``RankTarget``) may pin a rank with ``dp_rank`` (tests and benchmarks use
it to reproduce skewed traffic). A request is routed once and streams from
the replica that took it, so it never crosses into another group mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from roundgate.deployment.routing.kv_hub import KvPoll, hub_actor
from roundgate.routing import registry
from roundgate.routing.cache_aware import CacheAwareConfig, CacheAwarePolicy
from roundgate.routing.decode_load import DecodeLoadPolicy
from roundgate.routing.kv_router import KvCostPolicy, KvRouterConfig

logger = logging.getLogger("ray.serve")

# A kv router whose last poll is older than this waits up to STALE_WAIT_S for a fresh one.
STALE_AFTER_S = 0.2
STALE_WAIT_S = 0.05

# A pinned call that finds no replica of its rank backs off and retries; say so at most this
# often, with what the router sees, so a stale view of a restarted gang is visible in the log.
MISSING_RANK_LOG_S = 10.0

# Router name -> the class below that runs it (each router declares its own: ``routing``).
ROUTER_CLASSES = registry.serve_classes()


def pinned_rank(pending: PendingRequest | None) -> int | None:
    """The ``dp_rank`` a call's message (``GenerateRequest`` or ``RankTarget``) asks for."""
    if pending is None or not pending.args:
        return None
    rank = getattr(pending.args[0], "dp_rank", None)
    return None if rank is None else int(rank)


def pinned_gang(pending: PendingRequest | None) -> str | None:
    """The group a pinned call names (``RankTarget.gang_id``), if any."""
    if pending is None or not pending.args:
        return None
    return getattr(pending.args[0], "gang_id", None)


def _rank_of(replica: RunningReplica) -> int | None:
    # Static metadata arrives with the replica itself; periodic stats may lag (after a gang
    # restart they can take a while), so they are only the fallback.
    rank = replica.replica_metadata.get("dp_rank")
    return replica.routing_stats.get("dp_rank") if rank is None else rank


class _RankRouter(RequestRouter):
    """Shared handling of pinned requests; subclasses pick among the unpinned candidates."""

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        ranked = sorted(candidate_replicas, key=lambda r: str(r.replica_id))
        if pending_request is not None:
            # Every candidate is considered at once (no locality rounds), so an empty answer
            # means "wait". Serve only sleeps between attempts when told to back off; without
            # it the routing loop retries without ever yielding, the event loop that would
            # deliver the missing replica's arrival never runs again, and every call of this
            # process stops routing (a pinned call arriving between the two halves of a
            # restarted gang's announcement did exactly that).
            pending_request.routing_context.should_backoff = True
        pinned = pinned_rank(pending_request)
        if pinned is not None:
            # Empty until the ranks have reported their stats: the router backs off and retries.
            gang = pinned_gang(pending_request)
            matches = [
                r
                for r in ranked
                if _rank_of(r) == pinned
                and (gang is None or r.replica_metadata.get("gang_id") == gang)
            ]
            if not matches:
                self._log_missing_rank(pinned, ranked)
            return [matches[:1]] if matches else []
        if not ranked:
            return []
        return [[self.pick(ranked, pending_request)]]

    def pick(
        self, replicas: Sequence[RunningReplica], pending: PendingRequest | None = None
    ) -> RunningReplica:
        raise NotImplementedError

    def _log_missing_rank(self, rank: int, replicas: Sequence[RunningReplica]) -> None:
        now = time.monotonic()
        if now - getattr(self, "_missing_logged_at", -MISSING_RANK_LOG_S) < MISSING_RANK_LOG_S:
            return
        self._missing_logged_at = now
        seen = [
            (str(r.replica_id), r.replica_metadata, r.routing_stats.get("dp_rank"))
            for r in replicas
        ]
        logger.warning("no replica of dp rank %d among the candidates %s", rank, seen)


class RoundRobinRouter(_RankRouter):
    """Each new request goes to the next replica in a fixed order."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._next = 0

    def pick(
        self, replicas: Sequence[RunningReplica], pending: PendingRequest | None = None
    ) -> RunningReplica:
        replica = replicas[self._next % len(replicas)]
        self._next += 1
        return replica


def load_key(replica: RunningReplica, in_flight: int | None) -> tuple[float, float]:
    """Queued + running requests first (the larger of the rank's report and our in-flight
    count, since reports lag), KV occupancy as the tie-breaker."""
    stats = replica.routing_stats
    load = max(stats.get("load", 0), in_flight or 0)
    return (float(load), float(stats.get("kv_occupancy", 0.0)))


def pick_by_prompt(
    router: RequestRouter,
    replicas: Sequence[RunningReplica],
    pending: PendingRequest | None,
    choose: Callable[[list[str], list[float], Any, Any], Any],
) -> RunningReplica:
    """The prompt routers' shared pick: ``choose(ids, loads, prompt, session)`` names the
    replica (its ``.rank``) for a call carrying a prompt; one without goes to the least-loaded."""
    cache = router.replica_queue_len_cache
    loads = [load_key(r, cache.get(r.replica_id))[0] for r in replicas]
    message = pending.args[0] if pending is not None and pending.args else None
    prompt = getattr(message, "prompt_token_ids", None)
    if not prompt:
        return replicas[min(range(len(replicas)), key=lambda i: loads[i])]
    ids = [str(r.replica_id) for r in replicas]
    choice = choose(ids, loads, prompt, getattr(message, "session_id", None))
    return replicas[ids.index(choice.rank)]


class LeastLoadedRouter(_RankRouter):
    """The replica with the fewest unfinished requests (then the emptiest KV pool)."""

    def pick(
        self, replicas: Sequence[RunningReplica], pending: PendingRequest | None = None
    ) -> RunningReplica:
        cache = self.replica_queue_len_cache
        return min(replicas, key=lambda r: load_key(r, cache.get(r.replica_id)))


class SkewedRouter(_RankRouter):
    """Fixed weights per DP rank (e.g. ``8,1,1,1``): exercises the gate's ANY cadence."""

    def initialize_state(self, weights: Sequence[int] = (), seed: int = 0, **_: Any) -> None:
        self.weights = [int(w) for w in weights]
        self._rng = random.Random(seed)

    def pick(
        self, replicas: Sequence[RunningReplica], pending: PendingRequest | None = None
    ) -> RunningReplica:
        def weight(r: RunningReplica) -> int:
            rank = _rank_of(r)
            return self.weights[rank] if rank is not None and rank < len(self.weights) else 0

        weights = [weight(r) for r in replicas]
        if sum(weights) == 0:  # ranks have not reported yet
            return replicas[0]
        return self._rng.choices(list(replicas), weights=weights)[0]


class CacheAwareRouter(_RankRouter):
    """The replica whose rank holds the prompt's longest cached prefix, within load limits
    (``roundgate.routing.cache_aware``); replicas are indexed by replica id, so a replaced replica
    starts empty. Calls that carry no prompt go to the least-loaded replica."""

    def initialize_state(self, **config: Any) -> None:
        self.policy = CacheAwarePolicy(CacheAwareConfig(**config))

    def pick(
        self, replicas: Sequence[RunningReplica], pending: PendingRequest | None = None
    ) -> RunningReplica:
        return pick_by_prompt(self, replicas, pending, self.policy.choose)


class KvAwareRouter(_RankRouter):
    """The least-cost rank on what the ranks report holding (``roundgate.routing.kv_router``;
    ``gate_aware`` adds the gate's term). The index is fed by polling the KV-event hub
    (``roundgate.deployment.routing.kv_hub``) every ``poll_interval_s``, in the background: a choice
    never waits for the hub. Replicas are indexed by replica id, so a replaced replica starts empty;
    calls that carry no prompt go to the least-loaded replica."""

    def initialize_state(self, poll_interval_s: float = 0.02, **config: Any) -> None:
        self.policy: KvCostPolicy | DecodeLoadPolicy = self.make_policy(KvRouterConfig(**config))
        self.poll_interval_s = poll_interval_s
        self._hub: Any = None
        self._cursor = -1
        self._polling: asyncio.Future | None = None
        self._last_poll = float("-inf")
        self._poller = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"  # for the hub

    def make_policy(self, config: KvRouterConfig) -> KvCostPolicy | DecodeLoadPolicy:
        return KvCostPolicy(config)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        now = time.monotonic()
        stale = now - self._last_poll >= STALE_AFTER_S
        if self._polling is None and now - self._last_poll >= self.poll_interval_s:
            self._last_poll = now
            self._polling = asyncio.ensure_future(self._poll())
        if stale and self._polling is not None:
            # After a quiet spell (a session's next turn) the index may lack what the ranks
            # stored since: wait for this poll, briefly.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._polling), STALE_WAIT_S)
        return await super().choose_replicas(candidate_replicas, pending_request)

    async def _poll(self) -> None:
        try:
            if self._hub is None:
                self._hub = hub_actor()
                if self._hub is None:  # no cluster: nothing publishes
                    return
            resync = bool(self.policy.index.needs_resync())
            self.apply(await self._hub.poll.remote(self._cursor, resync, self._poller))
        except Exception as exc:  # the hub went away with its creator: make a new one
            logger.warning("KV-event hub poll failed (%s); reconnecting", exc)
            self._hub, self._cursor = None, -1
        finally:
            self._polling = None

    def apply(self, poll: KvPoll) -> None:
        """One poll's answer into the index (snapshots replace every rank's keys)."""
        index = self.policy.index
        if poll.snapshots is not None:
            live = {s.source for s in poll.snapshots}
            self.policy.forget([s for s in index.sources() if s not in live])
            for snapshot in poll.snapshots:
                index.resync(snapshot)
        for batch in poll.batches:
            index.apply(batch)
        if poll.gone:
            self.policy.forget(list(poll.gone))
        self._cursor = poll.cursor

    def pick(
        self, replicas: Sequence[RunningReplica], pending: PendingRequest | None = None
    ) -> RunningReplica:
        def choose(ids: list[str], loads: list[float], prompt: Any, session: Any) -> Any:
            return self.policy.choose(ids, loads, prompt, time.time(), session)

        return pick_by_prompt(self, replicas, pending, choose)


class DecodeLoadRouter(KvAwareRouter):
    """P/D's decode role under ``router: kv-aware``: the decode rank with the least decode
    load the ranks report through the same hub (``roundgate.routing.decode_load``: active KV
    tokens + waiting handoffs' tokens + this router's unsettled sends), Serve's request counts
    while no candidate has reported."""

    def make_policy(self, config: KvRouterConfig) -> DecodeLoadPolicy:
        return DecodeLoadPolicy(config)
