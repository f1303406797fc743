"""A call pinned to a rank the router does not see yet must wait without freezing the router.

Serve's routing loop (``RequestRouter._choose_replicas_with_backoff``) retries an empty choice
at once unless the router asked it to back off; the retries never yield, so the event loop that
would deliver the missing replica never runs. This drives Serve's own loop with our router: a
call pinned to rank 1 while only rank 0 is known, rank 1 arriving 50 ms later.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID
from ray.serve._private.request_router.common import RequestRoutingContext

from roundgate.actors.control.messages import RankTarget
from roundgate.deployment.routing.routers import ROUTER_CLASSES

CONFIG = {"cache-aware": {"page_size": 4, "max_pages_per_rank": 64}}
HANG_S = 20.0  # far beyond what the scenario needs; only bounds how long a regression hangs


@dataclass
class Replica:
    """What the routers read of Serve's ``RunningReplica``."""

    replica_id: str
    replica_metadata: dict = field(default_factory=dict)
    routing_stats: dict = field(default_factory=dict)


def make(name: str) -> Any:
    module, attr = ROUTER_CLASSES[name].split(":")
    cls = getattr(importlib.import_module(module), attr)
    router = cls(
        DeploymentID(name="RankReplica", app_name="roundgate"), DeploymentHandleSource.UNKNOWN
    )
    router.initialize_state(**CONFIG.get(name, {}))
    return router


def route_when_rank_arrives_late(router: Any, pinned: int | None) -> list[str] | str:
    """Route a call (pinned to ``pinned``, or unpinned) while only rank 0 is known; rank 1
    arrives 50 ms later. Returns the replica ids Serve's loop chose, or "hung"."""
    known = Replica("a", {"dp_rank": 0})
    router._replicas = {known.replica_id: known}
    router._replicas_list = [known]
    pending = SimpleNamespace(args=[RankTarget(pinned)], routing_context=RequestRoutingContext())
    result: dict[str, Any] = {}

    async def scenario() -> list[str]:
        attempts = router._choose_replicas_with_backoff(pending)
        first = asyncio.ensure_future(attempts.__anext__())
        await asyncio.sleep(0.05)  # never returns if the routing loop spins
        late = Replica("b", {"dp_rank": 1})
        router._replicas[late.replica_id] = late
        router._replicas_list = [known, late]
        chosen = await asyncio.wait_for(first, HANG_S)
        await attempts.aclose()
        return [r.replica_id for r in chosen]

    def run() -> None:
        result["chosen"] = asyncio.run(scenario())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    return "hung" if thread.is_alive() else result["chosen"]


@pytest.mark.parametrize("name", sorted(ROUTER_CLASSES))
def test_a_call_pinned_to_a_missing_rank_waits_and_routes_once_the_rank_arrives(name) -> None:
    assert route_when_rank_arrives_late(make(name), pinned=1) == ["b"]


def test_an_unpinned_call_still_routes_at_once() -> None:
    assert route_when_rank_arrives_late(make("round-robin"), pinned=None) == ["a"]


@pytest.mark.parametrize("name", sorted(ROUTER_CLASSES))
def test_a_call_pinned_to_a_group_and_rank_reaches_that_groups_rank(name) -> None:
    """With two groups, ``dp_rank`` alone picks one fixed group's rank; ``gang_id`` picks the
    group (how a test or an operator reaches every replica)."""
    router = make(name)
    replicas = [
        Replica(f"{gang}{rank}", {"dp_rank": rank, "gang_id": gang})
        for gang in ("g0", "g1")
        for rank in (0, 1)
    ]

    def chosen(target: RankTarget) -> list[str]:
        pending = SimpleNamespace(args=[target], routing_context=RequestRoutingContext())
        picked = asyncio.run(router.choose_replicas(replicas, pending))
        return [r.replica_id for group in picked for r in group]

    assert chosen(RankTarget(1, "g1")) == ["g11"]
    assert chosen(RankTarget(0, "g1")) == ["g10"]
    assert chosen(RankTarget(1, "g0")) == ["g01"]
    assert chosen(RankTarget(1)) == ["g01"]  # the rank's first replica, whichever group
    assert chosen(RankTarget(1, "nope")) == []  # no such group: wait (the router backs off)
