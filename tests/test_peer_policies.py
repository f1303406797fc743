"""The peer policies of PEER_POLICIES.md, scenario by scenario, as pure functions of rows."""

from __future__ import annotations

import pytest
from builders import make_args

from roundgate.gate.permission import ALLOW_ALL, CHUNKS_ONLY, HOLD_ALL
from roundgate.gate.rows import RankRow, read_rows
from roundgate.gate.sglang_delayer import SGLangDelayer, SGLangDelayerConfig
from roundgate.gate.trtllm_balance import TrtllmBalance, TrtllmBalanceConfig
from roundgate.gate.vllm_interval import VllmInterval
from roundgate.gate.vote import GateVote

# --- builders ---------------------------------------------------------------------------------


def sglang_row(
    pf: int, usage: float = 0.9, running: int = 4, max_bs: int = 1, waiting: int = 1, now: int = 0
) -> RankRow:
    """A row with SGLang's columns: prefillable, kv permille, running, max_prefill_bs, ..."""
    return RankRow(
        4, 4, 0, bool(pf), True, (pf, round(usage * 1000), running, max_bs, waiting, now)
    )


def delayer(skip_first_consumed: bool = True, **config) -> SGLangDelayer:
    policy = SGLangDelayer(SGLangDelayerConfig(**config), max_running_requests=8)
    if skip_first_consumed:
        policy.skip_first = False
    return policy


def decisions(policy, rounds: list[list[RankRow]]) -> list[str]:
    """Each round's group decision as ALLOW:<reason> or DELAY/HOLD (SGLang's ``decide``, the
    part every rank shares; other policies' votes)."""
    out = []
    for rows in rounds:
        vote = getattr(policy, "decide", policy.vote)(rows)
        observe(policy, rows)
        out.append(f"ALLOW:{vote.reason}" if vote.open else (vote.reason or "closed").upper())
    return out


def observe(policy, rows: list[RankRow]) -> None:
    policy.observe(rows, read_rows(rows))


# --- SGLang PrefillDelayer --------------------------------------------------------------------


def test_sglang_mixed_prefillable_delays_until_the_pass_limit() -> None:
    """P=3, WM=0.8, pf=[1,0,1,0], usage 0.9 for 3 rounds: DELAY, DELAY, ALLOW wait_timeout."""
    rows = [sglang_row(pf) for pf in (1, 0, 1, 0)]
    policy = delayer(max_delay_passes=3, token_usage_low_watermark=0.8)
    assert decisions(policy, [rows] * 4) == [
        "DELAY",
        "DELAY",
        "ALLOW:wait_timeout",
        "DELAY",  # the count starts again after an allow
    ]


@pytest.mark.parametrize(
    ("pf", "usage", "expected"),
    [
        pytest.param((1, 0, 1, 0), (0.5, 0.9, 0.9, 0.9), "ALLOW:token_watermark", id="watermark"),
        pytest.param((0, 0, 1, 0), (0.5, 0.9, 0.9, 0.9), "DELAY", id="low-usage-not-prefillable"),
        pytest.param((0, 0, 0, 0), (0.9,) * 4, "ALLOW:none", id="nobody-prefillable"),
        pytest.param((1, 1, 1, 1), (0.9,) * 4, "ALLOW:no_wait", id="all-prefillable-room"),
    ],
)
def test_sglang_scenarios(pf: tuple, usage: tuple, expected: str) -> None:
    rows = [sglang_row(p, u) for p, u in zip(pf, usage, strict=True)]
    policy = delayer(max_delay_passes=3, token_usage_low_watermark=0.8)
    assert decisions(policy, [rows]) == [expected]


def test_sglang_slot_condition_skips_first_then_delays_then_succeeds() -> None:
    """All prefillable but MRR - running < max_prefill_bs: the first pass is let through once
    per process, later ones wait until the slots free up (wait_success)."""
    full = [sglang_row(1, running=7, max_bs=4) for _ in range(2)]
    free = [sglang_row(1, running=2, max_bs=4) for _ in range(2)]
    policy = delayer(skip_first_consumed=False)
    assert decisions(policy, [full, full, full, free, free]) == [
        "ALLOW:no_wait",
        "DELAY",
        "DELAY",
        "ALLOW:wait_success",
        "ALLOW:no_wait",
    ]
    assert policy.wait_passes == [2]


def test_sglang_queue_condition_and_its_time_limit() -> None:
    """R set: delay while the queue is short of floor(running * R), but not past MS."""
    policy = delayer(queue_min_ratio=0.5, max_delay_ms=100.0)
    rows = [
        [sglang_row(1, running=8 - 4, max_bs=4, waiting=1, now=t) for _ in range(2)]
        for t in (0, 50, 99, 100, 150)
    ]
    assert decisions(policy, rows) == ["DELAY", "DELAY", "DELAY", "ALLOW:wait_success", "DELAY"]


def test_sglang_delay_lets_resident_chunks_run_but_admits_nothing_new() -> None:
    vote = delayer().vote([sglang_row(1), sglang_row(0)])
    assert not vote.open and vote.permission == CHUNKS_ONLY


@pytest.mark.parametrize(
    ("pf", "rank", "admits"),
    [
        pytest.param((0, 0), 0, False, id="fresh-prompt-is-published-first"),
        pytest.param((1, 1), 1, True, id="published-and-all-prefillable"),
        pytest.param((1, 1), 0, True, id="published-rank-0"),
    ],
)
def test_sglang_rank_admits_only_what_it_published(pf: tuple, rank: int, admits: bool) -> None:
    """The group allows ("none" or "no_wait"); a rank whose own row said nothing prefillable
    does not admit its fresh prompt yet: it publishes it and the group decides next round."""
    policy = SGLangDelayer(SGLangDelayerConfig(), max_running_requests=8, rank=rank)
    policy.skip_first = False
    vote = policy.vote([sglang_row(p) for p in pf])
    assert vote.reason in ("none", "no_wait")
    assert vote.open is admits
    assert vote.permission.allow_chunks


def test_sglang_lone_fresh_prompt_is_delayed_as_upstream() -> None:
    """Rank 0 gets a prompt while the group idles: round 1 it is published (not admitted);
    from round 2 pf=[1,0] is "mixed" and the delayer holds it up to P passes."""
    policy = SGLangDelayer(SGLangDelayerConfig(max_delay_passes=3), max_running_requests=8)
    policy.skip_first = False
    quiet = [sglang_row(0), sglang_row(0)]
    published = [sglang_row(1), sglang_row(0)]
    votes = [policy.vote(rows) for rows in (quiet, published, published, published)]
    assert [(v.open, v.reason) for v in votes] == [
        (False, "none"),
        (False, "delay"),
        (False, "delay"),
        (True, "wait_timeout"),
    ]


def test_sglang_outcome_counters_carry_actual_execution() -> None:
    policy = delayer(max_delay_passes=2)
    mixed = [sglang_row(1), sglang_row(0)]
    extended = [RankRow(9, 1, 1, False, True, (0,) * 6), RankRow(4, 4, 0, False, True, (0,) * 6)]
    policy.vote(mixed)
    observe(policy, mixed)
    policy.vote(mixed)
    observe(policy, extended)
    assert policy.outcomes == {
        ("mixed", False, "delay", False): 1,
        ("mixed", True, "wait_timeout", True): 1,
    }


@pytest.mark.parametrize(
    ("config", "flag"),
    [
        ({"max_delay_passes": 0}, "--prefill-delayer-max-delay-passes"),
        ({"token_usage_low_watermark": 1.5}, "--prefill-delayer-token-usage-low-watermark"),
        ({"queue_min_ratio": 0.0}, "--prefill-delayer-queue-min-ratio"),
        ({"max_delay_ms": 0.0}, "--prefill-delayer-max-delay-ms"),
        ({"prefill_max_requests": 0}, "--prefill-delayer-prefill-max-requests"),
    ],
)
def test_sglang_config_refusals_name_the_flag(config: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        SGLangDelayerConfig(**config)


# --- vLLM --prefill-schedule-interval -----------------------------------------------------------


def vllm_row(decoding: bool = True, waiting: int = 0, idle: bool = False) -> RankRow:
    if idle:
        return RankRow(0, 0, 0, False, False, (0,))
    return RankRow(4, 4, 0, waiting > 0, decoding, (waiting,))


class Local:
    """A stand-in for the rank's fresh probe."""

    def __init__(self, decoding: bool) -> None:
        self.wants_prefill = True
        self.has_decode_work = decoding


@pytest.mark.parametrize(
    ("interval", "decoding", "expected"),
    [
        pytest.param(2, True, "AdAdAd", id="N=2-decode-running"),
        pytest.param(3, True, "AddAdd", id="N=3-decode-running"),
        pytest.param(2, False, "AAAAAA", id="nothing-running-admits-despite-throttle"),
        pytest.param(1, True, "AAAAAA", id="N=1-is-off"),
    ],
)
def test_vllm_throttles_fresh_prefill_to_aligned_steps(
    interval: int, decoding: bool, expected: str
) -> None:
    policy = VllmInterval(interval)
    rows = [vllm_row(decoding)]
    got = ""
    for _ in expected:
        got += "A" if policy.vote(rows, Local(decoding)).open else "d"
        observe(policy, rows)
    assert got == expected


def test_vllm_capacity_bound_admits_on_the_next_throttled_step() -> None:
    """An aligned step that leaves the queue non-empty sets capacity_bound: no defer next."""
    policy = VllmInterval(2)
    assert policy.vote([vllm_row()], Local(True)).open  # step 0, aligned
    observe(policy, [vllm_row(waiting=3)])  # admission left 3 waiting: capacity bound
    assert policy.capacity_bound
    assert policy.vote([vllm_row(waiting=3)], Local(True)).open  # step 1 would throttle
    observe(policy, [vllm_row(waiting=0)])  # the queue drained
    assert not policy.capacity_bound
    assert policy.vote([vllm_row()], Local(True)).open  # step 2, aligned
    observe(policy, [vllm_row()])
    assert not policy.vote([vllm_row()], Local(True)).open  # step 3: throttled again


def test_vllm_defer_holds_in_flight_chunks_too_and_the_clock_resets_with_the_wave() -> None:
    policy = VllmInterval(2)
    observe(policy, [vllm_row()])  # step 1 next: throttled
    vote = policy.vote([vllm_row()], Local(True))
    assert vote.permission == HOLD_ALL
    observe(policy, [vllm_row(idle=True), vllm_row(idle=True)])  # the wave ended
    assert policy.step_counter == 0
    assert policy.vote([vllm_row()], Local(True)).permission == ALLOW_ALL


def test_vllm_interval_must_be_a_positive_integer() -> None:
    with pytest.raises(ValueError, match="--prefill-schedule-interval"):
        VllmInterval(0)


# --- TensorRT-LLM attention-DP balance ----------------------------------------------------------


def trt_rows(*ranks: tuple[int, int]) -> list[RankRow]:
    """Rows from (n_ctx, n_gen) per rank."""
    return [RankRow(ctx + gen, ctx + gen, 0, ctx > 0, gen > 0, (ctx, gen)) for ctx, gen in ranks]


@pytest.mark.parametrize(
    ("ranks", "expected"),
    [
        pytest.param(((1, 5), (1, 5)), "hhrhhr", id="all-ctx-all-gen-batches-B-rounds"),
        pytest.param(((1, 5), (0, 5)), "hhrhhr", id="one-rank-without-ctx-waits-T"),
        pytest.param(((1, 0), (0, 3)), "rrrrrr", id="a-rank-without-gen-releases-at-once"),
        pytest.param(((1, 5), (1, 8)), "hhrhhr", id="a-full-rank-waits-T"),
    ],
)
def test_trtllm_balance_scenarios(ranks: tuple, expected: str) -> None:
    """T=3, B=2, max_batch_size 8, 2 ranks (PEER_POLICIES.md)."""
    policy = TrtllmBalance(TrtllmBalanceConfig(timeout_iters=3, batching_wait_iters=2), 8)
    rows = trt_rows(*ranks)
    got = ""
    for _ in expected:
        vote = policy.vote(rows)
        observe(policy, rows)
        got += "r" if vote.open else "h"
    assert got == expected


def test_trtllm_hold_holds_every_context_request() -> None:
    policy = TrtllmBalance(TrtllmBalanceConfig(), max_batch_size=8)
    vote = policy.vote(trt_rows((1, 5), (1, 5)))
    assert vote.permission == HOLD_ALL and vote == GateVote(False, None, reason="hold")


@pytest.mark.parametrize(
    ("config", "flag"),
    [
        ({"timeout_iters": 0}, "--attention-dp-timeout-iters"),
        ({"batching_wait_iters": -1}, "--attention-dp-batching-wait-iters"),
    ],
)
def test_trtllm_config_refusals_name_the_flag(config: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        TrtllmBalanceConfig(**config)


# --- the per-rank limits come from the group's args, not from the policy's flags ----------------


@pytest.mark.parametrize(
    ("policy", "attribute"),
    [
        ("sglang-delayer", "max_running_requests"),
        ("trtllm-balance", "max_batch_size"),
    ],
)
def test_peer_limits_are_the_ranks_share_of_max_num_seqs(policy: str, attribute: str) -> None:
    args = make_args(3, policy, max_num_seqs=13)
    for rank in range(3):
        assert getattr(args.build_policy(rank), attribute) == 13 // 3 == args.max_batch_size
