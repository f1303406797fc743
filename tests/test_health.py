"""``/health``'s reading of Serve's status: healthy only while every rank replica runs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from roundgate.deployment import serve_context


def status(deployment_status: str, states: dict[str, int]) -> Any:
    ranks = SimpleNamespace(status=deployment_status, replica_states=states)
    app = SimpleNamespace(deployments={"RankReplica": ranks, "OpenAIServer": None})
    return SimpleNamespace(applications={"roundgate": app})


@pytest.mark.parametrize(
    ("deployment_status", "states", "reason"),
    [
        ("HEALTHY", {"RUNNING": 2}, None),
        ("UNHEALTHY", {"RUNNING": 1, "STARTING": 1}, "1 running, 1 starting"),
        ("HEALTHY", {"RUNNING": 1, "STOPPING": 1}, "1 running, 1 stopping"),
        ("UPDATING", {"RUNNING": 2}, "2 running"),
    ],
)
def test_rank_health(monkeypatch, deployment_status, states, reason) -> None:
    from ray import serve

    monkeypatch.setattr(serve, "status", lambda: status(deployment_status, states))
    got = serve_context.rank_health()
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_an_unreachable_controller_is_unhealthy(monkeypatch) -> None:
    from ray import serve

    def boom() -> Any:
        raise ConnectionError("controller gone")

    monkeypatch.setattr(serve, "status", boom)
    assert "cannot read" in serve_context.rank_health()
