"""Where the ingress replicas go: off the nodes whose loss the rank groups are built to survive.

Under ``gang_placement: spread`` each group puts one rank on each of several nodes so that a
lost node costs each group one rank and the groups serve on (elastic DP re-forms them). The
ingress replicas hold every client's connection and stream: left to Ray they land wherever
there is room, a worker node included, and that node's loss fails every stream behind them
(measured on two nodes: 4 of 4 streams failed, the next request answered 12.4 s later). So a
spread deployment keeps them on the head node by default, through the resource Ray gives only
that node (``roundgate.actors.head_node``); the head holds the GCS, whose loss is the
cluster's anyway. ``ingress_resources`` given in the config, even ``{}``, is the operator's
choice and is kept as given.

A head node offering too few CPUs for the ingress replicas (KubeRay heads often start with
``num-cpus: 0``) would leave them pending with no error: refused here instead, naming the
setting to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from roundgate.actors.head_node import HEAD_NODE_RESOURCE

# An ingress replica's CPU reservation (``build_app``).
INGRESS_CPUS = 0.25
_HEAD_SHARE = 0.001


def ingress_resources(
    given: Mapping[str, float], explicit: bool, gang_placement: str
) -> dict[str, float]:
    """The custom resources each ingress replica asks for: ``given`` when the config set it
    (``explicit``), the head node's under ``spread``, else none."""
    if explicit or gang_placement != "spread":
        return dict(given)
    return {HEAD_NODE_RESOURCE: _HEAD_SHARE}


def check_head_room(
    resources: Mapping[str, float], num_replicas: int, nodes: Sequence[Mapping[str, Any]]
) -> None:
    """Refuse ingress replicas pinned to a head node that cannot hold them (``nodes``: Ray's
    ``ray.nodes()`` rows). Nothing to check when they are not pinned to the head or no head
    is listed (a cluster not started yet)."""
    if HEAD_NODE_RESOURCE not in resources:
        return
    heads = [n for n in nodes if n.get("Alive") and HEAD_NODE_RESOURCE in n.get("Resources", {})]
    if not heads:
        return
    head_cpus = float(heads[0]["Resources"].get("CPU", 0.0))
    need = INGRESS_CPUS * num_replicas
    if head_cpus + 1e-9 < need:
        raise ValueError(
            f"ingress_resources: the {num_replicas} ingress replica(s) go on the head node "
            f"(gang_placement spread keeps them off the nodes a group may lose) and need "
            f"{need:g} CPUs there, but the head offers {head_cpus:g}; give the head CPUs "
            "(its num-cpus) or set ingress_resources to the nodes that should hold them"
        )
