"""``autoscaling``: Serve's autoscaler asked for whole groups, and the settings it refuses."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from roundgate.deployment.config import AppArgs

FUSED = {"model": "tiny-llama", "device": "cpu", "dp_size": 2, "elastic_dp": False}
SCALE = {"min_groups": 1, "max_groups": 3, "target_ongoing_requests_per_rank": 2}


def replica_options(**args: Any) -> dict[str, Any]:
    cfg = AppArgs.model_validate({**FUSED, **args})
    return cfg.replica_options(cfg.server_args().dp_size)


def test_the_range_and_the_start_are_whole_groups() -> None:
    options = replica_options(num_groups=2, autoscaling=SCALE)
    assert options["num_replicas"] == "auto"
    scale = options["autoscaling_config"]
    assert (scale["min_replicas"], scale["initial_replicas"], scale["max_replicas"]) == (2, 4, 6)
    assert scale["target_ongoing_requests"] == 2


def test_without_autoscaling_the_count_is_fixed() -> None:
    assert replica_options(num_groups=3) == {"num_replicas": 6}


def test_serve_takes_it_as_a_gang_deployment_that_scales() -> None:
    """Serve's own checks pass: an autoscaled gang deployment (it rounds to whole gangs)."""
    from roundgate.deployment.app import build_app

    app = build_app({**FUSED, "num_groups": 1, "autoscaling": SCALE})
    ranks = app._bound_deployment.init_kwargs["fused"]  # the ingress names the role it binds
    config = ranks._bound_deployment._deployment_config
    assert config.gang_scheduling_config.gang_size == 2
    assert config.autoscaling_config.max_replicas == 6


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"elastic_dp": True, "autoscaling": SCALE}, "elastic_dp"),
        ({"num_groups": 4, "autoscaling": SCALE}, "num_groups"),
        ({"autoscaling": {**SCALE, "min_groups": 4}}, "min_groups"),
        ({"autoscaling": {**SCALE, "max_replicas": 9}}, "max_replicas"),
        ({"autoscaling": {"min_groups": 1}}, "max_groups"),
    ],
)
def test_what_it_refuses_is_named(args: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        AppArgs.model_validate({**FUSED, **args})


def test_p_d_roles_do_not_autoscale() -> None:
    pd = {
        "model": "tiny-llama",
        "device": "cpu",
        "prefill": {"dp_size": 1},
        "decode": {"dp_size": 1},
        "autoscaling": SCALE,
    }
    with pytest.raises(ValidationError, match="P/D"):
        AppArgs.model_validate(pd)
