"""Routing the simulated group's requests to its ranks, as the deployment's routers would.

``Router`` chooses a rank for each request when it is sent; ``RouterSpec`` is its settings,
frozen, so one run's spec can build a fresh router (same seed, same choices) for each policy
it compares.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from roundgate.routing import registry
from roundgate.routing.cache_aware import CacheAwareConfig, CacheAwarePolicy
from roundgate.routing.kv_router import KvCostPolicy, KvRouterConfig, Matcher
from roundgate.routing.spec import flag
from roundgate.sim.kv_channel import ChannelSpec
from roundgate.sim.vllm_lb import VllmBalancer

if TYPE_CHECKING:
    from roundgate.actors.control.scheduler import Scheduler


@dataclass(frozen=True)
class RouterSpec:
    """Which router a run uses and its settings (``--router`` and the flags that tune it;
    the routers and their settings are declared in ``routing``)."""

    policy: str = registry.DEFAULT
    weights: tuple[int, ...] | None = None  # skewed: one weight per rank
    # cache-aware: sized like the ranks' pools (None: the policy's own defaults).
    cache_aware: CacheAwareConfig | None = None
    api_servers: int | None = None  # vllm-lb: API servers, each on its own view (None: 1)
    # kv-aware, gate-aware, oracle: the cost's weights (None: the defaults, gate term per
    # router) and the KV-event channel (None: its defaults; the oracle's has no lag or loss).
    kv: KvRouterConfig | None = None
    channel: ChannelSpec | None = None

    def build(self, dp_size: int, seed: int, page_size: int = 16) -> Router:
        """A fresh router for one run (validates the settings against ``dp_size``); the kv
        routers key prompts by the ranks' ``page_size``."""
        return Router(
            self.policy,
            dp_size,
            self.weights,
            seed,
            self.cache_aware,
            self.api_servers,
            self.kv,
            self.channel,
            page_size,
        )

    def check_policy(self, prefill_policy: str) -> None:
        """A router that reads the group gate (``gate-aware``) refuses a policy without one."""
        registry.check_prefill_policy(self.policy, prefill_policy, flag)


class Router:
    """Chooses a rank for each arrival: round-robin, least-loaded, fixed skewed weights, or
    vLLM's internal load balancer (``vllm-lb``: least ``4 x waiting + running`` on counts
    refreshed every 100 ms, so requests sent since the engines last reported are invisible
    to it after a refresh), cache-aware (``roundgate.routing.cache_aware``), or the cost
    routers on the ranks' KV events (``kv-aware``, ``gate-aware``, and the ``oracle``; the
    simulator feeds their index through ``roundgate.sim.kv_channel``)."""

    def __init__(
        self,
        policy: str,
        dp_size: int,
        weights: Sequence[int] | None = None,
        seed: int = 0,
        cache_aware: CacheAwareConfig | None = None,
        api_servers: int | None = None,
        kv: KvRouterConfig | None = None,
        channel: ChannelSpec | None = None,
        page_size: int = 16,
    ) -> None:
        registry.get(policy, "simulate", flag)
        given = {"route_weights": weights, "lb_api_servers": api_servers}
        registry.check((policy,), given, dp_size, "simulate", flag)
        kv_routers = registry.kv_event_routers("simulate")
        if (kv is not None or channel is not None) and policy not in kv_routers:
            raise ValueError(
                f"the KV-event flags apply to --router {', '.join(kv_routers)} only, not {policy}"
            )
        self.policy = policy
        self.dp_size = dp_size
        self.weights = list(weights or [])
        self._next = 0
        self._rng = random.Random(seed)
        self.vllm_lb = (
            VllmBalancer(dp_size, 1 if api_servers is None else api_servers, seed)
            if policy == "vllm-lb"
            else None
        )
        self.cache_aware = (
            CacheAwarePolicy(cache_aware or CacheAwareConfig()) if policy == "cache-aware" else None
        )
        self.kv: KvCostPolicy | None = None
        self.channel = channel or ChannelSpec()
        if policy in kv_routers:
            # The pools' page size (the keys must be theirs), the gate term per router.
            gate_aware = policy == "gate-aware"
            config = replace(kv or KvRouterConfig(), page_size=page_size, gate_aware=gate_aware)
            self.kv = KvCostPolicy(config)
            if policy == "oracle":
                self.channel = ChannelSpec(lag_rounds=0, loss_rate=0.0)

    def matcher(self, schedulers: Sequence[Scheduler]) -> Matcher | None:
        """How the kv routers see what a rank holds: the index fed by the event channel
        (None), or for the ``oracle`` the ranks' pools themselves (ranks named by position)."""
        if self.policy != "oracle":
            return None
        pools = [s.pool for s in schedulers]

        def match(source: object, keys: Sequence[bytes]) -> int:
            return pools[int(str(source))].num_cached_prefix(keys)

        return match

    def route(
        self, loads: Sequence[int], token_ids: Sequence[int] = (), session: str | None = None
    ) -> int:
        """``loads`` is each rank's unfinished request count; the cache-aware router also
        reads the prompt (and the session key, with affinity on)."""
        if self.cache_aware is not None:
            ranks = range(self.dp_size)
            return int(self.cache_aware.choose(ranks, loads, token_ids, session).rank)
        if self.policy == "round-robin":
            rank = self._next
            self._next = (self._next + 1) % self.dp_size
            return rank
        if self.policy == "least-loaded":
            return min(range(self.dp_size), key=lambda r: (loads[r], r))
        return self._rng.choices(range(self.dp_size), weights=self.weights)[0]

    def route_stale(self, now_s: float, waiting: Sequence[int], running: Sequence[int]) -> int:
        """``vllm-lb`` (``roundgate.sim.vllm_lb``): route on the last refreshed counts."""
        if self.vllm_lb is None:
            raise ValueError(f"route_stale is the vllm-lb router's, not {self.policy}'s")
        return self.vllm_lb.route(now_s, waiting, running)
