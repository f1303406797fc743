"""A scrape that meets a dead metrics hub asks for the hub again instead of failing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ray.exceptions import ActorDiedError

from roundgate.deployment import request_metrics
from roundgate.deployment.openai.errors import APIError


class _Hub:
    """A hub handle whose ``exposition`` fails while the hub is dead."""

    def __init__(self, dead: bool) -> None:
        self.dead = dead
        self.exposition = self

    def remote(self) -> Any:
        async def call() -> bytes:
            if self.dead:
                raise ActorDiedError()
            return b"roundgate_up 1.0\n"

        return call()


def _hubs(monkeypatch: pytest.MonkeyPatch, deaths: int) -> list[_Hub]:
    """``get_hub`` hands back the dead hub ``deaths`` times, then a live one."""
    handed: list[_Hub] = []

    def get_hub() -> _Hub:
        handed.append(_Hub(dead=len(handed) < deaths))
        return handed[-1]

    monkeypatch.setattr(request_metrics, "get_hub", get_hub)
    monkeypatch.setattr(request_metrics, "HUB_RETRY_S", 0.0)
    return handed


def test_a_scrape_after_the_hub_died_reaches_the_new_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = _hubs(monkeypatch, deaths=2)
    assert asyncio.run(request_metrics.exposition()) == b"roundgate_up 1.0\n"
    assert [h.dead for h in handed] == [True, True, False]


def test_a_hub_that_stays_dead_is_a_503_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = _hubs(monkeypatch, deaths=100)
    with pytest.raises(APIError) as err:
        asyncio.run(request_metrics.exposition())
    assert err.value.status == 503
    assert err.value.code == "metrics_hub_unavailable"
    assert "metrics hub" in err.value.message
    assert len(handed) == request_metrics.HUB_TRIES


def test_a_pusher_made_outside_ray_starts_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica's pusher runs in its Ray worker; one made elsewhere (a unit test, the offline
    engine) must not leave a thread behind that later pushes from a test session's driver."""
    import threading

    import ray

    from roundgate.actors.telemetry.metrics_hub import Pusher

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    before = {t for t in threading.enumerate() if t.name == "metrics-push"}
    pusher = Pusher("ingress:test", lambda: [])
    assert {t for t in threading.enumerate() if t.name == "metrics-push"} == before
    pusher.stop()  # nothing to join or drop
