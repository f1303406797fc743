"""``oracle``: the simulator's yardstick for the kv routers.

kv-aware's cost (``roundgate.routing.kv_router``) read off the ranks' pools themselves, with loads
that never lag: what a router that knew everything would choose. Simulated only.
"""

from __future__ import annotations

from roundgate.routing.kv_router import DECODE_WEIGHT, PREFILL_WEIGHT, cost_arguments
from roundgate.routing.options import BALANCE, SESSION_AFFINITY
from roundgate.routing.spec import RouterEntry

ROUTER = RouterEntry(
    name="oracle",
    summary="kv-aware's cost on the ranks' pools themselves, loads without lag (simulated "
    "only: the kv routers' yardstick)",
    options=(PREFILL_WEIGHT, DECODE_WEIGHT, *BALANCE, SESSION_AFFINITY),
    serve=False,
    reads_kv_events=True,
    arguments=lambda values, engine: cost_arguments(ROUTER, values, engine),
)
