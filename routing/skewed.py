"""``skewed``: fixed weights per DP rank (e.g. ``8,1,1,1``), drawn with a seeded generator.

It reproduces skewed traffic on purpose: some ranks idle while others queue, which exercises
the gate's ANY cadence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from roundgate.routing.spec import Option, RouterEntry, Spell

if TYPE_CHECKING:
    from roundgate.actors.server_args import ServerArgs

ROUTE_WEIGHTS = Option("route_weights", tuple, None, "one weight per dp rank, e.g. 8,1,1,1")


def check_weights(weights: Sequence[int] | None, dp_size: int, spell: Spell) -> None:
    """One weight per rank, none negative, some positive."""
    if weights is None or len(weights) != dp_size:
        raise ValueError(
            f"{spell('route_weights')} needs {dp_size} weights (one per dp rank) for "
            f"{spell('router')} skewed, got {list(weights or [])}"
        )
    if any(w < 0 for w in weights) or sum(weights) == 0:
        raise ValueError(f"{spell('route_weights')} must be >= 0 with a positive sum")


def _check(values: Mapping[str, Any], dp_size: int, spell: Spell) -> None:
    check_weights(values.get("route_weights"), dp_size, spell)


def _arguments(values: Mapping[str, Any], engine: ServerArgs) -> dict[str, Any]:
    return {"weights": values.get("route_weights"), "seed": engine.seed}


ROUTER = RouterEntry(
    name="skewed",
    summary="fixed weights per dp rank (--route-weights), seeded draws",
    options=(ROUTE_WEIGHTS,),
    serve_class="roundgate.deployment.routing.routers:SkewedRouter",
    arguments=_arguments,
    check=_check,
)
