"""Elastic ``/health`` reads Serve's status through a cache: one controller read per
``HEALTH_CACHE_S`` however many callers, and a controller that cannot answer is a 503
naming it (never a 500)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ingress_fakes import make_ingress

from roundgate.deployment.group_health import CachedRead
from roundgate.deployment.openai.errors import APIError


def test_a_controller_that_cannot_answer_is_one_read_and_a_503_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray import serve

    reads: list[int] = []

    def away() -> Any:
        reads.append(1)
        raise ConnectionError("controller gone")

    monkeypatch.setattr(serve, "status", away)
    core, _ = make_ingress()

    async def ask_many() -> list[APIError]:
        errors = []
        for _ in range(5):
            with pytest.raises(APIError) as info:
                await core.elastic_health()
            errors.append(info.value)
        return errors

    errors = asyncio.run(ask_many())
    assert {(e.status, e.code) for e in errors} == {(503, "controller_unavailable")}
    assert "Serve controller" in errors[0].message and "ConnectionError" in errors[0].message
    assert reads == [1]  # cached: one read for five requests


@pytest.mark.parametrize(("step", "reads"), [(0.4, 1), (2.0, 3)])
def test_a_cached_read_is_made_again_only_once_stale(step: float, reads: int) -> None:
    now = [0.0]
    made: list[float] = []

    def read() -> int:
        made.append(now[0])
        return len(made)

    cached = CachedRead(read, max_age_s=1.0, clock=lambda: now[0])

    async def ask() -> list[int]:
        got = []
        for _ in range(3):
            got.append(await cached.get())
            now[0] += step
        return got

    assert asyncio.run(ask())[-1] == reads and len(made) == reads
