"""The cost routers (kv-aware, gate-aware): their choices, the hub, Serve's router, the flags."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest
from ray.serve._private.request_router.common import RequestRoutingContext
from sim_builders import sim_args

from roundgate.actors.control.kv_events import KvEventBatch, KvSnapshot, RankLoad
from roundgate.actors.control.messages import GenerateRequest
from roundgate.actors.control.page_keys import page_keys
from roundgate.actors.control.request import SamplingParams
from roundgate.cli.main import main
from roundgate.deployment.config import AppArgs
from roundgate.deployment.routing.kv_hub import KvEventLogBook
from roundgate.deployment.routing.routers import KvAwareRouter
from roundgate.routing.kv_router import KvCostPolicy, KvRouterConfig
from roundgate.sim.round_costs import TOY
from roundgate.sim.router import RouterSpec
from roundgate.sim.sessions import SESSION_WORKLOADS, SessionSpec
from roundgate.sim.simulator import GroupSimulator
from roundgate.sim.spec import SimSpec, arrivals_of

PAGE = 4
SYSTEM = list(range(1, 17))  # four full pages
DECODING = RankLoad(num_running=2, active_tokens=64, has_decode_work=True)
BACKLOGGED = RankLoad(num_running=2, active_tokens=64, wants_prefill=True, has_decode_work=True)


def stored(source: str, tokens: list[int], seq: int = 0, load: RankLoad = DECODING) -> KvEventBatch:
    return KvEventBatch(source, 1, seq, tuple(page_keys(tokens, PAGE)), (), load)


def make_policy(**config) -> KvCostPolicy:
    return KvCostPolicy(KvRouterConfig(page_size=PAGE, **config))


def test_kv_aware_prefers_the_rank_holding_the_prefix_until_the_balance_limit() -> None:
    policy = make_policy(balance_abs_threshold=4)
    policy.index.apply(stored("b", SYSTEM))
    policy.index.apply(stored("a", [], load=DECODING))
    choice = policy.choose(["a", "b"], [0, 2], [*SYSTEM, 99], now_s=1.0)
    assert (choice.rank, choice.matched_tokens) == ("b", 16)
    # b now far past a in requests: the balance limit sends the prompt to a.
    choice = policy.choose(["a", "b"], [0, 9], [*SYSTEM, 98], now_s=2.0)
    assert (choice.rank, choice.reason) == ("a", "balance")


def test_what_a_router_sent_counts_on_the_rank_until_the_rank_reports_receiving_it() -> None:
    policy = make_policy(prefill_weight=0.0, decode_weight=1.0)
    for source in ("a", "b"):
        policy.index.apply(stored(source, [], load=RankLoad()))
    assert policy.choose(["a", "b"], [0, 0], [5] * 40, now_s=1.0).rank == "a"
    assert policy.choose(["a", "b"], [0, 0], [6] * 40, now_s=1.0).rank == "b"
    # A report from a that does not show the send yet: a still carries it, so a tie -> a.
    policy.index.apply(KvEventBatch("a", 1, 1, (), (), RankLoad(active_tokens=8), sent_s=2.0))
    assert policy.choose(["a", "b"], [0, 0], [7] * 40, now_s=2.0).rank == "b"
    # a reports both received and drained: it is the cheap one again.
    policy.index.apply(KvEventBatch("a", 1, 2, (), (), RankLoad(num_received=1), sent_s=3.0))
    assert policy.choose(["a", "b"], [0, 0], [8] * 40, now_s=3.0).rank == "a"


@pytest.mark.parametrize(
    ("loads", "gate_aware", "kv_aware"),
    [
        # a has backlog, b decodes without: b blocks the ALL point, so gate-aware sends the
        # prompt there; kv-aware alone takes the idle rank (least active KV).
        ({"a": BACKLOGGED, "b": DECODING, "c": RankLoad()}, "b", "c"),
        # Nobody blocks ALL: the gate term is silent, both take the cheapest rank.
        ({"a": BACKLOGGED, "b": BACKLOGGED, "c": RankLoad()}, "c", "c"),
    ],
)
def test_gate_aware_fills_the_all_point(loads, gate_aware, kv_aware) -> None:
    for policy, expected in ((make_policy(gate_aware=True), gate_aware), (make_policy(), kv_aware)):
        for source, load in loads.items():
            policy.index.apply(KvEventBatch(source, 1, 0, (), (), load))
        assert policy.choose(list(loads), [2, 2, 0], [9] * 12, now_s=1.0).rank == expected


def test_the_hub_serves_batches_then_snapshots_to_a_router_left_behind() -> None:
    hub = KvEventLogBook(max_batches=2)
    first = hub.poll(-1)  # a new router starts from a snapshot
    assert first.snapshots == () and first.batches == ()
    hub.publish([stored("a", SYSTEM[:8], seq=0)])
    poll = hub.poll(first.cursor)
    assert [b.seq for b in poll.batches] == [0] and poll.snapshots is None
    hub.publish([stored("a", SYSTEM, seq=1), stored("a", SYSTEM, seq=2)])
    behind = hub.poll(poll.cursor - 1)  # its next batch fell off the bounded log
    assert behind.snapshots is not None and behind.batches == ()
    (snapshot,) = behind.snapshots
    assert snapshot.keys == frozenset(page_keys(SYSTEM, PAGE)) and snapshot.seq == 2
    hub.leave("a")
    assert hub.poll(behind.cursor, poller="r1").gone == ("a",)
    assert hub.pollers() == {"r1": hub.cursor()}  # how far each named router has read
    # A rank that (re)connects sends a snapshot first: every router resyncs from the hub.
    hub.publish([KvSnapshot("b", 5, 3, frozenset(), RankLoad())])
    assert hub.poll(behind.cursor + 1).snapshots is not None


@dataclass
class FakeReplica:
    replica_id: str
    routing_stats: dict = field(default_factory=dict)
    replica_metadata: dict = field(default_factory=dict)


class LocalHub:
    """The hub's own logic behind the two calls the router makes (``x.remote(...)``)."""

    def __init__(self, book: KvEventLogBook) -> None:
        async def poll(cursor: int, resync: bool = False, poller: str | None = None):
            return book.poll(cursor, resync, poller)

        self.poll = SimpleNamespace(remote=poll)


def test_the_serve_router_routes_on_what_the_hub_says_and_never_to_a_replica_that_left() -> None:
    book = KvEventLogBook()
    router = KvAwareRouter.__new__(KvAwareRouter)  # no Serve controller behind it
    router._replica_queue_len_cache = {"a": 0, "b": 0}
    router.initialize_state(page_size=PAGE, poll_interval_s=0.0)
    router._hub = LocalHub(book)
    book.publish([stored("b", SYSTEM)])
    book.publish([stored("a", [])])
    replicas = [FakeReplica("a"), FakeReplica("b")]
    message = GenerateRequest(
        request_id="r", prompt_token_ids=(*SYSTEM, 50), sampling=SamplingParams()
    )

    async def pick(replicas):
        await router.choose_replicas(replicas, None)  # starts a poll
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        pending = SimpleNamespace(args=[message], routing_context=RequestRoutingContext())
        (chosen,) = await router.choose_replicas(replicas, pending)
        return chosen[0].replica_id

    assert asyncio.run(pick(replicas)) == "b"
    # b left: only a is a candidate, and the hub's word drops b's entry.
    book.leave("b")
    assert asyncio.run(pick([FakeReplica("a")])) == "a"
    assert router.policy.index.sources() == ["a"]


def test_the_simulated_channel_without_lag_or_loss_mirrors_the_pools() -> None:
    args = sim_args(dp_size=4, enable_prefix_caching=True)
    preset = replace(SESSION_WORKLOADS["chat-sessions"], output_len=20, turns=3, think_s=0.05)
    workload = SessionSpec(
        preset, num_sessions=12, rate=8.0, vocab_size=args.model_config.vocab_size
    )
    spec = SimSpec(args, workload, TOY, RouterSpec("oracle"))
    sim = GroupSimulator(args, TOY, spec.router.build(4, 0, args.page_size))
    result = sim.run(arrivals_of(spec))
    assert result.unfinished == 0 and result.prefix_hits > 0
    index = sim.router.kv.index
    for rank, loop in enumerate(sim.loops):
        assert index.keys(str(rank)) == set(loop.scheduler.pool.cached_keys())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"router": "gate-aware", "prefill_policy": "none"}, "gate-aware needs prefill_policy"),
        ({"router": "kv-aware", "decode_weight": -1}, "decode_weight"),
        ({"router": "gate-aware", "gate_weight": -0.5}, "gate_weight"),
        ({"router": "no-such-router"}, "router"),
    ],
)
def test_bad_router_settings_are_refused_at_startup_by_name(extra, message) -> None:
    engine = {"model": "tiny-moe", "dp_size": 2, "page_size": 4, "num_kv_pages": 64}
    with pytest.raises(ValueError, match=message):
        AppArgs.model_validate({**engine, **extra})


def test_the_app_gives_the_cost_router_the_ranks_page_size() -> None:
    engine = {"model": "tiny-moe", "dp_size": 2, "page_size": 4, "num_kv_pages": 64}
    gate = {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}
    app = AppArgs.model_validate({**engine, **gate, "router": "gate-aware"})
    kwargs = app.router_kwargs()
    assert kwargs["page_size"] == 4 and kwargs["gate_aware"] is True
    KvRouterConfig(**kwargs)  # the router's own config accepts them


SIM = ["simulate", "--dp-size", "2", "--max-num-seqs", "16", "--num-kv-pages", "64",
       "--page-size", "16", "--num-requests", "12", "--rate", "50", "--input-len", "64",
       "--output-len", "4", "--no-progress"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--router", "gate-aware", "--policy", "none"], "--router gate-aware"),
        (["--router", "gate-aware", "--compare", "roundgate,vllm-interval"], "--router gate-aware"),
        (["--router", "kv-aware", "--prefill-weight", "-1"], "--prefill-weight"),
        (["--router", "kv-aware", "--kv-event-loss", "1.5"], "--kv-event-loss"),
        (["--router", "kv-aware", "--kv-snapshot-rounds", "0"], "--kv-snapshot-rounds"),
        (["--router", "round-robin", "--decode-weight", "2"], "--decode-weight"),
        (["--router", "kv-awar"], "--router"),
    ],
)
def test_bad_simulate_router_flags_are_one_line_errors_naming_the_flag(capsys, argv, flag) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*SIM, *argv])
    assert exc.value.code == 2
    error = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(error) == 1 and flag in error[0], error


@pytest.mark.parametrize("router", ["kv-aware", "gate-aware", "oracle"])
def test_simulate_runs_each_cost_router(router: str) -> None:
    assert main([*SIM, "--router", router, "--kv-event-lag-rounds", "2"]) == 0
