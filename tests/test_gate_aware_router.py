"""The gate-aware router's choices given the gate's state (``roundgate.routing.gate_cohort``): it
fills the ALL point's blockers, spreads a window's backlog, and keeps new prompts on a cohort that
the arrivals can fill before the ANY bound."""

from __future__ import annotations

from dataclasses import replace

import pytest

from roundgate.actors.control.kv_events import KvEventBatch, RankLoad
from roundgate.deployment.config import AppArgs
from roundgate.routing.gate_cohort import ArrivalRate, Cohort, cohort_size
from roundgate.routing.kv_router import KvCostPolicy, KvRouterConfig

PAGE = 4
PROMPT = [7] * 40  # ten pages, cached nowhere

IDLE = RankLoad()
DECODING = RankLoad(num_running=4, active_tokens=400, has_decode_work=True)


def backlogged(backlog_tokens: int, active_tokens: int = 400) -> RankLoad:
    return RankLoad(
        num_running=4,
        num_waiting=1,
        backlog_tokens=backlog_tokens,
        active_tokens=active_tokens,
        wants_prefill=True,
        has_decode_work=True,
    )


def policy_with(loads: dict[str, RankLoad], **config) -> KvCostPolicy:
    policy = KvCostPolicy(KvRouterConfig(page_size=PAGE, gate_aware=True, **config))
    for source, load in loads.items():
        policy.index.apply(KvEventBatch(source, 1, 0, (), (), load))
    return policy


@pytest.mark.parametrize(
    ("loads", "expected", "why"),
    [
        (
            {"a": backlogged(40), "b": DECODING, "c": IDLE},
            "b",
            "b decodes without backlog: it blocks ALL, so the prompt goes there, not to the "
            "idle rank (which blocks nothing) nor to a",
        ),
        (
            {"a": backlogged(460, active_tokens=0), "b": backlogged(230, active_tokens=4000)},
            "b",
            "nobody blocks: the window prefills a's 460 tokens and b's 230 in one round, so the "
            "prompt joins the smaller backlog although a holds far less KV",
        ),
        (
            {"a": backlogged(40), "b": backlogged(40), "c": IDLE},
            "c",
            "nobody blocks and c has no backlog at all",
        ),
        (
            {"a": DECODING, "b": replace(DECODING, active_tokens=90)},
            "b",
            "two blockers: the one with less KV (the kv cost decides among them)",
        ),
    ],
)
def test_choice_given_the_gate_state(loads, expected, why) -> None:
    policy = policy_with(loads)
    assert policy.choose(list(loads), [4] * len(loads), PROMPT, now_s=1.0).rank == expected, why


def test_a_send_not_yet_received_counts_as_backlog() -> None:
    """Two prompts before any report: the first unblocks a, so the second fills b."""
    policy = policy_with({"a": DECODING, "b": DECODING, "c": backlogged(20)})
    ranks = ["a", "b", "c"]
    assert policy.choose(ranks, [4, 4, 5], PROMPT, now_s=1.0).rank == "a"
    assert policy.choose(ranks, [5, 4, 5], PROMPT, now_s=1.0).rank == "b"
    # Every rank now has backlog (reported, or sent: 40 tokens each): the least, c's 20.
    assert policy.choose(ranks, [5, 5, 5], PROMPT, now_s=1.0).rank == "c"


def test_prompts_stay_on_the_cohort_while_the_load_limits_allow() -> None:
    """Horizon known, rate not yet: the cohort is the fewest allowed (half of 4 ranks), so the
    idle ranks c and d get nothing and drain, until the balance limit passes a cohort rank
    over."""
    loads = {"a": backlogged(40), "b": backlogged(40), "c": IDLE, "d": IDLE}
    policy = policy_with(loads, gate_horizon_rounds=12, gate_cohort_fraction=0.5)
    ranks = list(loads)
    for _ in range(4):
        assert policy.choose(ranks, [4, 4, 0, 0], PROMPT, now_s=1.0).rank in ("a", "b")
    # a and b 40 requests past the idle ranks: the load limit sends the prompt outside.
    choice = policy.choose(ranks, [40, 40, 0, 0], PROMPT, now_s=1.0)
    assert (choice.rank, choice.reason) == ("c", "balance")


@pytest.mark.parametrize(
    ("horizon", "fraction", "expected"),
    [
        (None, 0.5, {"a", "b", "c", "d"}),  # no fixed ANY bound (roundgate-auto): no cohort
        (12, 1.0, {"a", "b", "c", "d"}),  # fraction 1: never concentrate
        (12, 0.5, {"a", "b"}),
    ],
)
def test_the_cohort_needs_a_horizon_and_a_fraction_below_one(horizon, fraction, expected) -> None:
    loads = {source: IDLE for source in "abcd"}
    policy = policy_with(loads, gate_horizon_rounds=horizon, gate_cohort_fraction=fraction)
    chosen = {policy.choose(list(loads), [0] * 4, PROMPT, now_s=1.0).rank for _ in range(8)}
    assert chosen == expected


@pytest.mark.parametrize(
    ("ranks", "per_round", "horizon", "fraction", "size"),
    [
        (8, None, 12, 0.75, 6),  # rate unknown: the cohort
        (8, 0.41, 12, 0.75, 6),  # dp=8 chat 12 req/s: 4.9 prompts by the last ALL point
        (8, 0.2, 12, 0.75, 8),  # 2.4 (+2 sd 5.5) < 6: out of reach, step aside
        (8, 0.2, 12, 0.5, 4),  # ... but 4 is within reach
        (8, 0.7, 12, 0.75, 8),  # 8.4: the arrivals fill every rank, step aside
        (128, 9.2, 12, 0.75, 96),  # dp=128 chat, 2 req/s a rank: 110 prompts
        (128, 4.6, 12, 0.75, 128),  # 1 req/s a rank: 55 (+2 sd 70) < 96, step aside
        (128, 9.2, None, 0.75, 128),  # no horizon (roundgate-auto): the whole group
        (8, 0.41, 12, 1.0, 8),  # fraction 1: never concentrate
        (1, 0.1, 12, 0.1, 1),
    ],
)
def test_cohort_size(ranks, per_round, horizon, fraction, size) -> None:
    assert cohort_size(ranks, per_round, horizon, fraction) == size


def test_the_arrival_rate_is_per_gate_round_and_ignores_the_rounds_across_a_window() -> None:
    rate = ArrivalRate()
    # 10 ms rounds, 50 arrivals/s: 0.5 a round. Windows every 16 rounds reset the counter.
    received = 0
    for step in range(200):
        t = step * 0.01
        received = int(t * 50)
        rate.observe(t, step % 16, received)
    assert rate.per_round == pytest.approx(0.5, rel=0.05)
    rate.observe(2.0, 3, received - 5)  # a rank restarted: its counter went back
    rate.observe(2.01, 4, received - 4)
    assert rate.per_round == pytest.approx(0.5, rel=0.05)  # no sample from the restart


def test_the_first_sample_is_dropped_and_only_grows_a_busy_start() -> None:
    """The first 16 rounds (a start: reports from before traffic) are not the rate; they only
    grow the cohort to the whole group when busy enough to fill every rank with a margin."""
    rate = ArrivalRate()
    for step in range(17):  # 10 ms rounds, 200 arrivals/s: 2 a round
        rate.observe(step * 0.01, step, step * 2)
    assert rate.per_round is None and rate.first == pytest.approx(2.0)
    busy = Cohort()
    busy.rate = rate
    assert busy.update(8, 12, 0.5) == 8  # 24 prompts by the ALL point >= 1.25 x 8
    quiet = Cohort()
    quiet.rate.first = 0.7  # 8.4 prompts: fills 8, but not with the margin
    assert quiet.update(8, 12, 0.5) == 4
    quiet.rate.first = 0.05  # out of reach of the cohort: no matter, the rate is not known
    assert quiet.update(8, 12, 0.5) == 4


def test_the_cohort_grows_at_once_and_shrinks_only_with_a_margin() -> None:
    cohort = Cohort()
    assert cohort.update(8, 12, 0.5) == 4  # rate unknown
    cohort.rate.per_round = 0.7  # 8.4 prompts: every rank fills, the whole group at once
    assert cohort.update(8, 12, 0.5) == 8
    cohort.rate.per_round = 0.6  # 7.2 asks for 4, but 1.25 x 7.2 = 9 would not: kept
    assert cohort.update(8, 12, 0.5) == 8
    cohort.rate.per_round = 0.5  # 6 and 1.25 x 6 = 7.5 both ask for 4: shrinks
    assert cohort.update(8, 12, 0.5) == 4
    cohort.rate.per_round = 0.05  # 0.6 (+2 sd 2.1) < 4: out of reach, the whole group
    assert cohort.update(8, 12, 0.5) == 8
    cohort.rate.per_round = 0.15  # 1.8 (+2 sd 4.5) reaches 4, 1.44 (+2 sd 3.8) not: kept
    assert cohort.update(8, 12, 0.5) == 8
    cohort.rate.per_round = 0.2  # 2.4 (+2 sd 5.5) and 1.92 (+2 sd 4.7) both reach 4: shrinks
    assert cohort.update(8, 12, 0.5) == 4


def test_the_app_gives_gate_aware_the_gates_horizon() -> None:
    engine = {"model": "tiny-moe", "dp_size": 2, "page_size": 4, "num_kv_pages": 64}
    gate = {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}
    app = AppArgs.model_validate({**engine, **gate, "router": "gate-aware"})
    kwargs = app.router_kwargs()
    assert kwargs["gate_horizon_rounds"] == 12 and kwargs["gate_cohort_fraction"] == 0.75
    KvRouterConfig(**kwargs)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"router": "gate-aware", "gate_cohort_fraction": 1.5}, "gate_cohort_fraction"),
        ({"router": "gate-aware", "gate_cohort_fraction": -0.1}, "gate_cohort_fraction"),
        ({"router": "kv-aware", "gate_cohort_fraction": 0.5}, "gate-aware only"),
    ],
)
def test_bad_cohort_settings_are_refused_by_name(extra, message) -> None:
    engine = {"model": "tiny-moe", "dp_size": 2, "page_size": 4, "num_kv_pages": 64}
    gate = {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16}
    with pytest.raises(ValueError, match=message):
        AppArgs.model_validate({**engine, **gate, **extra})
