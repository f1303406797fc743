"""An elastic deployment's /health body: which groups run short, from the ranks' series."""

from __future__ import annotations

from roundgate.deployment.group_health import group_sizes, health_body

EXPOSITION = """# HELP roundgate_group_size Live ranks of the rank's DP group (elastic DP)
# TYPE roundgate_group_size gauge
roundgate_group_size{group="d-g0",model="m",dp_rank="0"} 1.0
roundgate_group_size{group="d-g0",model="m",dp_rank="1"} 2.0
roundgate_group_size{group="d-g1",model="m",dp_rank="0"} 2.0
roundgate_group_size{group="d-g1",model="m",dp_rank="1"} 2.0
# HELP roundgate_rank_running_requests Resident requests
# TYPE roundgate_rank_running_requests gauge
roundgate_rank_running_requests{group="d-g0",model="m",dp_rank="0"} 3.0
"""


def test_a_groups_size_is_the_smallest_its_ranks_report() -> None:
    # d-g0's rank 1 was left out of the last re-form and still says 2: the group has 1.
    assert group_sizes(EXPOSITION) == {"d-g0": 1, "d-g1": 2}


def test_the_body_names_the_short_groups() -> None:
    body = health_body(group_sizes(EXPOSITION), dp_size=2, running=3, expected=4)
    assert body == {
        "status": "degraded",
        "groups": {"d-g0": {"live": 1, "expected": 2}},
        "rank_replicas": {"running": 3, "expected": 4},
    }


def test_a_full_deployment_is_ok() -> None:
    assert health_body({"d-g0": 2}, dp_size=2, running=2, expected=2) == {"status": "ok"}
    # A replacement still loading: every group reports full size, one replica is not running.
    assert health_body({"d-g0": 2}, 2, running=1, expected=2)["status"] == "degraded"
