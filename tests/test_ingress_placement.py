"""Under gang_placement spread the ingress replicas stay on the head node unless the config
says where they go; a head too small for them is refused naming ingress_resources."""

from __future__ import annotations

from typing import Any

import pytest

from roundgate.actors.head_node import HEAD_NODE_RESOURCE
from roundgate.deployment.ingress_placement import check_head_room, ingress_resources

BASE = {"model": "tiny-llama", "dp_size": 2}


def ingress_options(**args: Any) -> dict[str, Any]:
    from roundgate.deployment.app import build_app

    app = build_app({**BASE, **args})
    return app._bound_deployment.ray_actor_options


def test_a_spread_deployment_keeps_its_ingress_on_the_head_node_by_default() -> None:
    options = ingress_options(gang_placement="spread", ingress_replicas=2)
    assert options["resources"] == {HEAD_NODE_RESOURCE: 0.001}
    assert options["num_cpus"] == 0.25


def test_a_packed_deployment_leaves_its_ingress_to_ray() -> None:
    assert "resources" not in ingress_options()
    assert "resources" not in ingress_options(gang_placement="pack")


@pytest.mark.parametrize("given", [{}, {"node_a": 0.01}])
def test_ingress_resources_given_are_kept_as_given_even_empty(given: dict[str, float]) -> None:
    options = ingress_options(gang_placement="spread", ingress_resources=given)
    assert options.get("resources", {}) == given


def _node(cpus: float, head: bool, alive: bool = True) -> dict[str, Any]:
    resources: dict[str, float] = {"CPU": cpus}
    if head:
        resources[HEAD_NODE_RESOURCE] = 1.0
    return {"Alive": alive, "Resources": resources}


def test_a_head_without_room_for_the_ingress_is_refused_naming_the_setting() -> None:
    pinned = ingress_resources({}, explicit=False, gang_placement="spread")
    nodes = [_node(0.0, head=True), _node(16.0, head=False)]  # KubeRay's num-cpus 0 head
    with pytest.raises(ValueError, match=r"ingress_resources: .*need 0\.5 CPUs.*offers 0"):
        check_head_room(pinned, 2, nodes)
    check_head_room(pinned, 2, [_node(0.5, head=True)])  # room for exactly two
    check_head_room({"node_a": 0.01}, 2, nodes)  # not pinned to the head: nothing to check
    check_head_room(pinned, 2, [])  # no cluster listed yet
