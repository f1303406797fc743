"""Where a rank runs: its device type and, on a multi-node cluster, its node's address."""

from __future__ import annotations


def device_type(name: str) -> str:
    """``cuda`` or ``cpu``: the device the runner will use (the backend follows from it)."""
    from roundgate.actors.model.runner_config import resolve_device

    return resolve_device(name).type


def multinode_host() -> str | None:
    """rank 0's node address when the cluster spans nodes; None for a single node."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) <= 1:
        return None
    return ray.util.get_node_ip_address()


def node_id() -> str:
    """The Ray node this process runs on (where placement put it)."""
    import ray

    return ray.get_runtime_context().get_node_id()
