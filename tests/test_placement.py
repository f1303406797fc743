"""``gang_placement`` and ``resources_per_rank``: what each asks of Serve for the rank
deployments (gangs, elastic replicas, each P/D role), and the refusals that name the key."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from ray.serve.config import GangPlacementStrategy

from roundgate.deployment.config import AppArgs

FUSED = {"model": "tiny-llama", "device": "cpu", "dp_size": 2}
PD = {
    "model": "tiny-llama",
    "device": "cpu",
    "prefill": {"dp_size": 1, "resources_per_rank": {"node_a": 0.1}},
    "decode": {"dp_size": 2},
}


def options(**args: Any) -> dict[str, Any]:
    cfg = AppArgs.model_validate({**FUSED, **args})
    return cfg.placement(cfg.server_args().dp_size, cfg.elastic_dp)


@pytest.mark.parametrize(
    ("placement", "strategy"),
    [("pack", GangPlacementStrategy.PACK), ("spread", GangPlacementStrategy.SPREAD)],
)
def test_a_gang_takes_serves_strategy(placement: str, strategy: GangPlacementStrategy) -> None:
    gang = options(gang_placement=placement)["gang_scheduling_config"]
    assert (gang.gang_size, gang.gang_placement_strategy) == (2, strategy)


def test_elastic_spread_caps_each_node_at_one_rank_per_group() -> None:
    assert options(elastic_dp=True) == {}
    assert options(elastic_dp=True, gang_placement="spread") == {"max_replicas_per_node": 1}
    assert options(elastic_dp=True, gang_placement="spread", num_groups=3) == {
        "max_replicas_per_node": 3
    }


def test_custom_resources_reach_the_ranks_and_a_role_may_have_its_own() -> None:
    cfg = AppArgs.model_validate({**PD, "resources_per_rank": {"node_b": 0.1}})
    prefill = cfg.rank_actor_options(*cfg.role_resources("prefill"))
    decode = cfg.rank_actor_options(*cfg.role_resources("decode"))
    assert prefill["resources"] == {"node_a": 0.1}  # the section's own
    assert decode["resources"] == {"node_b": 0.1}  # the shared one
    assert "resources" not in AppArgs.rank_actor_options(1.0, 0.0, {})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"gang_placement": "strict"}, "gang_placement"),
        ({"resources_per_rank": {"CPU": 1}}, "resources_per_rank: 'CPU' is not a custom resource"),
        ({"resources_per_rank": {"node_a": 0}}, "resources_per_rank: 'node_a' must be > 0"),
    ],
)
def test_refusals_name_the_key(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AppArgs.model_validate({**FUSED, **args})


def test_a_role_section_s_resources_are_checked_by_name() -> None:
    bad = {**PD, "decode": {"dp_size": 1, "resources_per_rank": {"GPU": 1}}}
    with pytest.raises(ValidationError, match=r"decode\.resources_per_rank: 'GPU'"):
        AppArgs.model_validate(bad)
