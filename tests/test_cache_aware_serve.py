"""The cache-aware router in Serve: its config, the session key from the API, its picks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from ingress_fakes import complete, make_ingress
from ray.serve._private.request_router.common import RequestRoutingContext

from roundgate.actors.control.messages import GenerateRequest, RankTarget
from roundgate.actors.control.request import SamplingParams
from roundgate.deployment.config import AppArgs
from roundgate.deployment.routing.routers import CacheAwareRouter

ENGINE = {"model": "tiny-moe", "dp_size": 2, "page_size": 4, "num_kv_pages": 64}


def test_the_app_args_give_the_router_the_ranks_page_geometry() -> None:
    args = AppArgs.model_validate(
        {**ENGINE, "router": "cache-aware", "balance_abs_threshold": 8, "session_affinity": True}
    )
    assert args.router_kwargs() == {
        "page_size": 4,
        "max_pages_per_rank": 64,
        "balance_abs_threshold": 8,
        "balance_rel_threshold": 1.0001,
        "session_affinity": True,
    }


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"router": "least-loaded", "session_affinity": True}, "session_affinity applies"),
        ({"router": "cache-aware", "balance_rel_threshold": 0.5}, "balance_rel_threshold"),
        ({"router": "cache-aware", "balance_abs_threshold": -1}, "balance_abs_threshold"),
    ],
)
def test_bad_router_settings_are_refused_by_name(extra, message) -> None:
    with pytest.raises(ValueError, match=message):
        AppArgs.model_validate({**ENGINE, **extra})


def test_the_clients_user_field_becomes_the_session_key() -> None:
    core, ranks = make_ingress()
    complete(core, prompt="hello", max_tokens=2, user="alice")
    complete(core, prompt="hello", max_tokens=2)
    assert [m.session_id for m in ranks.payloads] == ["alice", None]


@dataclass
class FakeReplica:
    replica_id: str
    routing_stats: dict = field(default_factory=dict)
    replica_metadata: dict = field(default_factory=dict)


def make_router(loads: dict[str, int]) -> CacheAwareRouter:
    router = CacheAwareRouter.__new__(CacheAwareRouter)  # no Serve controller behind it
    router._replica_queue_len_cache = loads  # read with .get(replica_id)
    router.initialize_state(page_size=4, max_pages_per_rank=64)
    return router


def pick(router: CacheAwareRouter, replicas, message) -> str:
    pending = (
        SimpleNamespace(args=[message], routing_context=RequestRoutingContext())
        if message is not None
        else None
    )
    (chosen,) = asyncio.run(router.choose_replicas(replicas, pending))
    return chosen[0].replica_id


def generate(prompt: list[int]) -> GenerateRequest:
    return GenerateRequest(
        request_id="r", prompt_token_ids=tuple(prompt), sampling=SamplingParams()
    )


def test_picks_follow_the_prefix_then_fall_back_to_the_least_loaded() -> None:
    replicas = [FakeReplica("a"), FakeReplica("b")]
    loads = {"a": 1, "b": 0}
    router = make_router(loads)
    system = list(range(1, 17))
    assert pick(router, replicas, generate([*system, 50])) == "b"  # nothing cached yet
    loads["b"] = 3
    assert pick(router, replicas, generate([*system, 60])) == "b"  # its prefix is on b
    assert pick(router, replicas, generate([99] * 8)) == "a"  # no match: least loaded
    assert pick(router, replicas, RankTarget()) == "a"  # no prompt: least loaded
    # b replaced by a new replica: the prefix no longer pulls toward it.
    replicas[1] = FakeReplica("b2")
    loads["b2"] = 2
    assert pick(router, replicas, generate([*system, 70])) == "a"
