"""``gate-aware``: the kv-aware cost plus the gate's term (``routing.kv_router``).

Under the group gate a new prompt waits for an ALL point or the ANY bound; a decoding rank
without prefill backlog blocks ALL, so the cost adds ``gate_weight`` to every other rank while
one does. It reads the gate's ALL point, so the ranks must run a prefill policy that has one.
"""

from __future__ import annotations

from routing.kv_router import DECODE_WEIGHT, GATE_WEIGHT, PREFILL_WEIGHT, cost_arguments
from routing.options import BALANCE, SESSION_AFFINITY
from routing.spec import RouterEntry

ROUTER = RouterEntry(
    name="gate-aware",
    summary="kv-aware's cost plus a term for leaving the gate's ALL point blocked",
    options=(PREFILL_WEIGHT, DECODE_WEIGHT, GATE_WEIGHT, *BALANCE, SESSION_AFFINITY),
    serve_class="deployment.routing.routers:KvAwareRouter",
    reads_kv_events=True,
    needs_prefill_policy=("roundgate", "roundgate-auto"),
    arguments=lambda values, engine: cost_arguments(ROUTER, values, engine),
)
