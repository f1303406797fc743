"""vLLM's internal data-parallel load balancer, the simulator's ``vllm-lb`` router.

Each API server process routes with its own copy of the engines' ``(waiting, running)``
counts, refreshed from the DP coordinator (``vllm/v1/engine/coordinator.py``: at most every
100 ms) and otherwise bumped locally: the chosen engine's ``waiting`` grows by the number of
API servers per send, so one server's sends stand for everyone's between refreshes
(``DPLBAsyncMPClient.get_core_engine_for_request`` in ``vllm/v1/engine/core_client.py``:
least ``4 x waiting + running``, scanning from the server's own start engine). vLLM starts
``data_parallel_size`` API servers under internal load balancing unless told otherwise
(``vllm/entrypoints/cli/serve.py``); the servers share one port, so the kernel spreads a
client's connections over them (uniformly here). With one server this is the router the
``gb200-dsv3`` preset was fitted with (docs/cost-model.md, section 5).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

# "stats updates from the coordinator (which happen every 100ms)" (core_client.py).
VLLM_LB_REFRESH_S = 0.1


class VllmBalancer:
    """Routes on stale counts; every API server holds its own view between refreshes."""

    def __init__(self, dp_size: int, api_servers: int = 1, seed: int = 0) -> None:
        if isinstance(api_servers, bool) or not isinstance(api_servers, int) or api_servers < 1:
            raise ValueError(f"--lb-api-servers must be an integer >= 1, got {api_servers!r}")
        self.dp_size = dp_size
        self.api_servers = api_servers
        self._rng = random.Random(seed)
        self._views = [[[0, 0] for _ in range(dp_size)] for _ in range(api_servers)]
        # Server ``s`` starts its scan at engine ``dp * s // servers`` (ties go there first).
        self._orders = [
            [(dp_size * s // api_servers + i) % dp_size for i in range(dp_size)]
            for s in range(api_servers)
        ]
        self._next_refresh_s = 0.0

    def route(self, now_s: float, waiting: Sequence[int], running: Sequence[int]) -> int:
        """The rank for a request sent at ``now_s``; ``waiting``/``running`` are what the
        engines would report now, read only when a refresh is due."""
        if now_s >= self._next_refresh_s:
            counts = list(zip(waiting, running, strict=True))
            for view in self._views:
                for rank, (w, r) in enumerate(counts):
                    view[rank][0], view[rank][1] = w, r
            ticks = int(now_s / VLLM_LB_REFRESH_S) + 1
            self._next_refresh_s = ticks * VLLM_LB_REFRESH_S
        server = self._rng.randrange(self.api_servers) if self.api_servers > 1 else 0
        view = self._views[server]
        # ``min`` keeps the first of equal scores in scan order, as vLLM's strict ``<`` does.
        rank = min(self._orders[server], key=lambda r: 4 * view[r][0] + view[r][1])
        view[rank][0] += self.api_servers
        return rank
