"""``gate-aware``: the kv-aware cost plus the gate's terms (``roundgate.routing.gate_cohort``).

Under the group gate a new prompt waits for an ALL point or the ANY bound. The router sends
it to a decoding rank that blocks ALL (no backlog), spreads one window's backlog over the
ranks (the window's round costs the largest), and, where the arrivals can give backlog to a
share of the ranks but not to all of them before the ANY bound, keeps new prompts on that
share so the rest drain and stop blocking. It reads the gate's ALL point, so the ranks must
run a prefill policy that has one; the cohort also needs the fixed gate's intervals.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roundgate.routing.gate_cohort import GATE_COHORT_FRACTION
from roundgate.routing.kv_router import DECODE_WEIGHT, GATE_WEIGHT, PREFILL_WEIGHT, cost_arguments
from roundgate.routing.options import BALANCE, SESSION_AFFINITY
from roundgate.routing.spec import RouterEntry, Spell


def _check(values: Mapping[str, Any], dp_size: int, spell: Spell) -> None:
    """The cohort is a share of the ranks: at most all of them."""
    fraction = values.get(GATE_COHORT_FRACTION.name)
    if fraction is not None and fraction > 1.0:
        raise ValueError(f"{spell(GATE_COHORT_FRACTION.name)} must be <= 1, got {fraction}")


ROUTER = RouterEntry(
    name="gate-aware",
    summary="kv-aware's cost plus the gate's: fill the ALL point's blockers, spread a "
    "window's backlog, and a cohort of ranks where the arrivals cannot fill them all",
    options=(
        PREFILL_WEIGHT,
        DECODE_WEIGHT,
        GATE_WEIGHT,
        GATE_COHORT_FRACTION,
        *BALANCE,
        SESSION_AFFINITY,
    ),
    serve_class="roundgate.deployment.routing.routers:KvAwareRouter",
    reads_kv_events=True,
    needs_prefill_policy=("roundgate", "roundgate-auto"),
    arguments=lambda values, engine: cost_arguments(ROUTER, values, engine),
    check=_check,
)
