"""P/D routing on what the ranks hold (``router: kv-aware``): the prefill rank by kv-aware's
cost on the prefill ranks' own KV events, the decode rank by the decode load the decode ranks
report; the config that selects it; the simulator's P/D running the same code."""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from builders import make_args
from pydantic import ValidationError
from ray.serve._private.request_router.common import RequestRoutingContext
from sim_builders import sim_args
from test_kv_router import FakeReplica, LocalHub
from test_pd_config import pd_args

from roundgate.actors.control.config import SchedulerConfig
from roundgate.actors.control.handoff import Handoff
from roundgate.actors.control.kv_events import KvEventBatch, KvEventLog, KvPublisher
from roundgate.actors.control.rank_load import rank_load
from roundgate.actors.control.request import SamplingParams
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.replica.pd_messages import DecodeRequest
from roundgate.cli.main import main
from roundgate.deployment.config import AppArgs
from roundgate.deployment.routing.kv_hub import KvEventLogBook
from roundgate.deployment.routing.routers import ROUTER_CLASSES, DecodeLoadRouter
from roundgate.routing.decode_load import DecodeLoadPolicy
from roundgate.routing.kv_router import KvRouterConfig
from roundgate.sim.disaggregated import simulate_pd
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import RouterSpec
from roundgate.sim.sessions import SESSION_WORKLOADS, SessionSpec
from roundgate.sim.spec import SimSpec

PAGE = 4


def handoff(request_id: str, num_tokens: int) -> Handoff:
    """A one-sequence handoff of a ``num_tokens`` prompt (its pages are not read here)."""
    pages = tuple(range(-(-num_tokens // PAGE)))
    return Handoff(
        request_id=request_id,
        prompt_token_ids=tuple([7] * num_tokens),
        sampling=SamplingParams(),
        first_token_ids=(3,),
        first_logprobs=(None,),
        prompt_logprobs=(),
        page_ids=pages,
        num_kv_tokens=num_tokens,
    )


class DecodeRank:
    """A real decode-role scheduler and its KV-event publisher (the rank's side, no Ray)."""

    def __init__(self, source: str) -> None:
        args = make_args(1, "none", disaggregation_mode="decode", num_kv_pages=64)
        self.scheduler = Scheduler(SchedulerConfig.from_args(args).replace(max_model_len=None))
        log = self.scheduler.pool.events = KvEventLog()
        self.publisher = KvPublisher(source, 1, log, self.scheduler.pool.cached_keys)

    def take(self, *handoffs: Handoff) -> None:
        for h in handoffs:
            self.scheduler.connector.add_handoff(h)

    def report(self, now_s: float = 0.0) -> KvEventBatch:
        batch = self.publisher.publish(rank_load(self.scheduler), now_s)
        assert batch is not None
        return batch


def test_a_decode_rank_reports_waiting_handoffs_as_received_backlog() -> None:
    rank = DecodeRank("a")
    rank.take(handoff("x", 40), handoff("y", 24))
    load = rank.report().load
    # What its pool will have to hold, and the counter the router settles its sends on.
    assert (load.num_waiting, load.backlog_tokens, load.num_received) == (2, 64, 2)
    assert not load.wants_prefill  # a decode rank never asks for prefill


def test_the_decode_rank_is_the_least_reported_decode_load_not_the_fewest_requests() -> None:
    policy = DecodeLoadPolicy(KvRouterConfig(page_size=PAGE))
    a, b = DecodeRank("a"), DecodeRank("b")
    a.take(handoff("long", 200))  # one request, a long one
    b.take(handoff("s1", 8), handoff("s2", 8))  # two short ones
    for rank in (a, b):
        policy.index.apply(rank.report())
    # Serve counts a as the lighter rank; the reports say b holds far fewer tokens.
    choice = policy.choose(["a", "b"], [1, 2], [5] * 16, now_s=1.0)
    assert (choice.rank, choice.reason) == ("b", "cost")


def test_sends_count_on_a_decode_rank_until_it_reports_receiving_them() -> None:
    policy = DecodeLoadPolicy(KvRouterConfig(page_size=PAGE))
    a, b = DecodeRank("a"), DecodeRank("b")
    for rank in (a, b):
        policy.index.apply(rank.report())
    assert policy.choose(["a", "b"], [0, 0], [5] * 60, now_s=1.0).rank == "a"
    # a has not reported the handoff yet: it still carries its 60 tokens, so b is cheaper.
    assert policy.choose(["a", "b"], [0, 0], [5] * 20, now_s=1.0).rank == "b"
    assert policy.choose(["a", "b"], [0, 0], [5] * 20, now_s=1.0).rank == "b"
    # Both report what arrived (a: 60 tokens waiting, b: 40): the sends are settled, and the
    # reported backlogs alone decide.
    a.take(handoff("x", 60))
    b.take(handoff("y", 20), handoff("z", 20))
    for rank in (a, b):
        policy.index.apply(rank.report(2.0))
    assert policy.choose(["a", "b"], [1, 2], [5] * 8, now_s=2.0).rank == "b"


def test_without_any_report_the_decode_rank_is_the_fewest_requests() -> None:
    policy = DecodeLoadPolicy(KvRouterConfig(page_size=PAGE))
    choice = policy.choose(["a", "b", "c"], [3, 1, 2], [5] * 8, now_s=0.0)
    assert (choice.rank, choice.reason, policy.num_fallbacks) == ("b", "counts", 1)
    # One rank reported: tokens decide from now on (the others' costs are their sends).
    policy.index.apply(DecodeRank("c").report())
    choice = policy.choose(["a", "b", "c"], [3, 1, 2], [5] * 8, now_s=0.0)
    assert choice.rank != "b" and policy.num_fallbacks == 1


def test_the_balance_limit_still_applies_to_the_decode_role() -> None:
    policy = DecodeLoadPolicy(KvRouterConfig(page_size=PAGE, balance_abs_threshold=2))
    a, b = DecodeRank("a"), DecodeRank("b")
    b.take(handoff("big", 200))
    for rank in (a, b):
        policy.index.apply(rank.report())
    # a holds nothing but Serve counts it far more loaded than b (reports lag): balance.
    choice = policy.choose(["a", "b"], [9, 1], [5] * 8, now_s=1.0)
    assert (choice.rank, choice.reason) == ("b", "balance")


def test_the_decode_role_serve_router_reads_the_hub_and_the_handoffs_prompt() -> None:
    book = KvEventLogBook()
    router = DecodeLoadRouter.__new__(DecodeLoadRouter)  # no Serve controller behind it
    router._replica_queue_len_cache = {"a": 0, "b": 0}
    router.initialize_state(page_size=PAGE, poll_interval_s=0.0)
    router._hub = LocalHub(book)
    a, b = DecodeRank("a"), DecodeRank("b")
    a.take(handoff("held", 120))
    book.publish([a.report()])
    book.publish([b.report()])
    message = DecodeRequest(handoff=handoff("r", 16))
    replicas = [FakeReplica("a"), FakeReplica("b")]

    async def pick() -> str:
        await router.choose_replicas(replicas, None)  # starts a poll
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        pending = SimpleNamespace(args=[message], routing_context=RequestRoutingContext())
        (chosen,) = await router.choose_replicas(replicas, pending)
        return chosen[0].replica_id

    assert asyncio.run(pick()) == "b"
    assert router.policy.index.load("a")[0].backlog_tokens == 120


# ---- the config -------------------------------------------------------------------------


def test_pd_kv_aware_routes_both_roles_on_what_the_ranks_publish() -> None:
    cfg = AppArgs.model_validate(pd_args(router="kv-aware", decode_weight=0.1))
    assert (cfg.pd_router("prefill"), cfg.pd_router("decode")) == ("kv-aware", "decode-load")
    assert cfg.publishes_kv_events
    for role in ("prefill", "decode"):
        assert cfg.rank_flags(role)["publish_kv_events"] is True
        assert cfg.rank_flags(role)["disaggregation_mode"] == role
    prefill = cfg.pd_router_kwargs("prefill")
    assert prefill["decode_weight"] == 0.1 and prefill["gate_aware"] is False
    assert prefill["page_size"] == 16
    # Each role's Serve router takes its arguments.
    for role in ("prefill", "decode"):
        module, name = ROUTER_CLASSES[cfg.pd_router(role)].split(":")
        cls = getattr(importlib.import_module(module), name)
        router = cls.__new__(cls)  # no Serve controller behind it
        router.initialize_state(**cfg.pd_router_kwargs(role))


def test_pd_without_a_router_keeps_the_ingress_guess_and_serve_counts() -> None:
    cfg = AppArgs.model_validate(pd_args(session_affinity=True))
    assert (cfg.pd_router("prefill"), cfg.pd_router("decode")) == ("cache-aware", "least-loaded")
    assert not cfg.publishes_kv_events
    assert not cfg.rank_flags("decode").get("publish_kv_events")
    assert cfg.pd_router_kwargs("prefill")["session_affinity"] is True
    assert cfg.pd_router_kwargs("decode") == {}


@pytest.mark.parametrize(
    ("router", "message"),
    [
        ("gate-aware", "router gate-aware: a P/D deployment runs no prefill gate"),
        (
            "round-robin",
            "router 'round-robin': a P/D deployment routes with cache-aware or kv-aware",
        ),
        ("skewed", "router 'skewed'"),
        ("kv-awre", "router"),  # not a router at all
    ],
)
def test_a_router_pd_cannot_run_is_refused_naming_it(router: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as exc:
        AppArgs.model_validate(pd_args(router=router))
    assert router in str(exc.value)


# ---- the simulator ----------------------------------------------------------------------


def session_run(router: str, split=(4, 2)) -> tuple[dict[str, Any], Any]:
    args = sim_args("none", dp_size=sum(split), enable_prefix_caching=True)
    preset = replace(SESSION_WORKLOADS["chat-sessions"], output_len=12, turns=3, think_s=0.05)
    workload = SessionSpec(
        preset, num_sessions=10, rate=6.0, vocab_size=args.model_config.vocab_size
    )
    spec = SimSpec(args, workload, PRESETS["h100-dsv3"], RouterSpec(router), seed=3)
    result, sim = simulate_pd(spec, *split)
    return summarize(result), sim


def test_the_simulated_pd_routes_both_groups_on_their_own_kv_events() -> None:
    kv, sim = session_run("kv-aware")
    rr, _ = session_run("round-robin")
    assert kv["unfinished"] == rr["unfinished"] == 0
    # The prefill rank holding a session's pages gets its next turn: more hits than blind.
    assert kv["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.1
    # The decode choices read the decode ranks' reports (a fallback only before any came).
    assert sim.decode_policy is not None
    assert sim.decode_policy.num_fallbacks < sim.num_transfers // 2
    assert sorted(map(str, sim.decode_policy.index.sources())) == ["0", "1"]
    assert sum(s.connector.num_received for s in sim.decode.schedulers) == sim.num_transfers


def test_simulate_disaggregate_refuses_gate_aware_naming_the_flag(capsys) -> None:
    argv = ["simulate", "--disaggregate", "1:3", "--router", "gate-aware", "--no-progress"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "--router gate-aware: a P/D deployment runs no prefill gate" in capsys.readouterr().err
