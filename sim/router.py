"""Routing the simulated group's requests to its ranks, as the deployment's routers would.

``Router`` chooses a rank for each request when it is sent; ``RouterSpec`` is its settings,
frozen, so one run's spec can build a fresh router (same seed, same choices) for each policy
it compares.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from deployment.routing.cache_aware import CacheAwareConfig, CacheAwarePolicy
from sim.vllm_lb import VllmBalancer

ROUTERS = ("round-robin", "least-loaded", "skewed", "vllm-lb", "cache-aware")


@dataclass(frozen=True)
class RouterSpec:
    """Which router a run uses and its settings (``--router`` and the flags that tune it)."""

    policy: str = "round-robin"
    weights: tuple[int, ...] | None = None  # skewed: one weight per rank
    # cache-aware: sized like the ranks' pools (None: the policy's own defaults).
    cache_aware: CacheAwareConfig | None = None
    api_servers: int | None = None  # vllm-lb: API servers, each on its own view (None: 1)

    def build(self, dp_size: int, seed: int) -> Router:
        """A fresh router for one run (validates the settings against ``dp_size``)."""
        return Router(self.policy, dp_size, self.weights, seed, self.cache_aware, self.api_servers)


class Router:
    """Chooses a rank for each arrival: round-robin, least-loaded, fixed skewed weights, or
    vLLM's internal load balancer (``vllm-lb``: least ``4 x waiting + running`` on counts
    refreshed every 100 ms, so requests sent since the engines last reported are invisible
    to it after a refresh), or cache-aware (``deployment.routing.cache_aware``)."""

    def __init__(
        self,
        policy: str,
        dp_size: int,
        weights: Sequence[int] | None = None,
        seed: int = 0,
        cache_aware: CacheAwareConfig | None = None,
        api_servers: int | None = None,
    ) -> None:
        if policy not in ROUTERS:
            raise ValueError(f"--router must be one of {', '.join(ROUTERS)}, got {policy!r}")
        if policy == "skewed":
            if weights is None or len(weights) != dp_size:
                raise ValueError(
                    f"--route-weights needs {dp_size} weights (one per rank) for --router "
                    f"skewed, got {list(weights or [])}"
                )
            if any(w < 0 for w in weights) or sum(weights) == 0:
                raise ValueError("--route-weights must be >= 0 with a positive sum")
        elif weights is not None:
            raise ValueError(f"--route-weights applies to --router skewed only, not {policy}")
        if api_servers is not None and policy != "vllm-lb":
            raise ValueError(f"--lb-api-servers applies to --router vllm-lb only, not {policy}")
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
        """``vllm-lb`` (``sim.vllm_lb``): route on the last refreshed counts."""
        if self.vllm_lb is None:
            raise ValueError(f"route_stale is the vllm-lb router's, not {self.policy}'s")
        return self.vllm_lb.route(now_s, waiting, running)
