"""The newer peers of PEER_POLICIES.md (vLLM #51199, ATOM #1611, TPU inference #2577/#2656),
scenario by scenario: tables of gathered rows over rounds and the decisions they must give."""

from __future__ import annotations

import pytest
from sim_builders import make_spec, simulate

from roundgate.gate import registry
from roundgate.gate.atom_coalescer import AtomCoalescer, AtomCoalescerConfig
from roundgate.gate.permission import ALLOW_ALL, CHUNKS_ONLY, HOLD_ALL
from roundgate.gate.rows import RankRow, read_rows
from roundgate.gate.spec import PolicyContext
from roundgate.gate.tpu_dp_hold import TpuDpHold, TpuDpHoldConfig
from roundgate.gate.vllm_alignment import VllmAlignment, VllmAlignmentConfig
from roundgate.sim.round_costs import PRESETS

NEWER = ("vllm-alignment", "atom-coalescer", "tpu-dp-hold")


def label(vote) -> str:
    return f"ALLOW:{vote.reason}" if vote.open else (vote.reason or "closed").upper()


def play(policies: list, rounds: list[list[RankRow]]) -> list[str]:
    """Each round's decision, which every rank's instance must share; each instance votes
    and then observes the round's gathered rows, as ``RankLoop`` does."""
    out = []
    for rows in rounds:
        votes = {label(policy.vote(rows)) for policy in policies}
        for policy in policies:
            policy.observe(rows, read_rows(rows))
        assert len(votes) == 1, votes
        out.append(votes.pop())
    return out


# --- vLLM adaptive prefill alignment (#51199) --------------------------------------------------


def vrow(admissible: int, running: int = 1, max_bs: int = 1, busy: bool = True) -> RankRow:
    """A row with the alignment's columns: admissible, running, max_prefill_bs."""
    size = 4 if busy else 0
    extras = (admissible, running, max_bs)
    return RankRow(size, size, 0, bool(admissible), busy, extras)


def vrows(*admissible: int, **kw) -> list[RankRow]:
    return [vrow(a, **kw) for a in admissible]


def aligners(dp: int = 4, mrr: int = 8, **config) -> list[VllmAlignment]:
    return [VllmAlignment(VllmAlignmentConfig(**config), mrr) for _ in range(dp)]


ALL = vrows(1, 1, 1, 1)
NONE = vrows(0, 0, 0, 0)
MIXED = vrows(1, 0, 0, 0)


@pytest.mark.parametrize(
    ("lead", "rounds", "expected"),
    [
        pytest.param(2, [ALL, ALL, NONE, NONE], "H H all H", id="lead-2"),
        pytest.param(1, [ALL, NONE, NONE], "H all H", id="lead-1"),
        pytest.param(3, [ALL, ALL, ALL, NONE, NONE], "H H H all H", id="lead-3"),
    ],
)
def test_vllm_coordinated_release_lands_lead_rounds_after_the_rows(
    lead: int, rounds: list, expected: str
) -> None:
    """Every rank deferred a prompt with room for it: one release, the same round on every
    rank, ``target_step_lead`` rounds after the rows that decided it."""
    got = play(aligners(target_step_lead=lead), rounds)
    short = {"HOLD": "H", "ALLOW:all_prefillable": "all"}
    assert " ".join(short[g] for g in got) == expected


@pytest.mark.parametrize("passes", [1, 3, 30])
def test_vllm_mixed_readiness_fails_open_after_the_delay_limit(passes: int) -> None:
    """Only rank 0 deferred: delayed ``max_delay_passes`` rounds, then released anyway."""
    policies = aligners(max_delay_passes=passes, target_step_lead=1)
    got = play(policies, [MIXED] * (passes + 1))
    assert got == ["HOLD"] * passes + ["ALLOW:max_delay_fail_open"]


def test_vllm_fail_open_recovers_and_the_count_restarts() -> None:
    """After a release the delay count starts again: a steady trickle on one rank gets a
    release every P rounds (plus the round the release is applied and acknowledged)."""
    rounds = [MIXED, MIXED, NONE] * 2  # each release admits rank 0's prompt
    got = play(aligners(max_delay_passes=2, target_step_lead=1), rounds)
    assert got == ["HOLD", "HOLD", "ALLOW:max_delay_fail_open"] * 2


def test_vllm_a_round_without_demand_resets_the_delay() -> None:
    got = play(aligners(max_delay_passes=3, target_step_lead=1), [MIXED, MIXED, NONE] * 3)
    assert set(got) == {"HOLD"}


@pytest.mark.parametrize(
    ("after_release", "expected"),
    [
        pytest.param(MIXED, "ALLOW:capacity_force_allow", id="left-prompts-capacity-release"),
        pytest.param(NONE, "HOLD", id="drained-no-capacity-release"),
    ],
)
def test_vllm_capacity_release(after_release: list, expected: str) -> None:
    """A rank still admissible right after a release's plan (its budget or batch ran out) is
    capacity bound: while it stays backed up, the group releases at once instead of waiting
    out the delay limit."""
    rounds = [ALL, after_release, MIXED, MIXED]
    got = play(aligners(target_step_lead=1), rounds)
    assert got == ["HOLD", "ALLOW:all_prefillable", "HOLD", expected]


def test_vllm_one_lease_at_a_time() -> None:
    """While a release is out, rows decide nothing; its own round's rows acknowledge it (every
    rank applied it in the lockstep round), and only then can the next one be decided."""
    got = play(aligners(target_step_lead=3), [ALL] * 8)
    assert got == ["HOLD"] * 3 + ["ALLOW:all_prefillable"] + ["HOLD"] * 3 + [
        "ALLOW:capacity_force_allow"  # still admissible after the release: capacity bound
    ]


def test_vllm_slot_limited_skips_the_first_delay_then_is_bounded() -> None:
    """Every rank ready but MRR - running < max prefill batch: the first time per wave the
    release goes at once, later ones wait for the delay limit."""
    full = vrows(1, 1, running=8, max_bs=1)
    drained = vrows(0, 0, running=8, max_bs=1)  # the release round's rows: all admitted
    rounds = [full, drained, full, full, full]
    got = play(aligners(dp=2, max_delay_passes=2, target_step_lead=1), rounds)
    assert got == [
        "HOLD",
        "ALLOW:first_delay_skip",
        "HOLD",
        "HOLD",
        "ALLOW:max_delay_fail_open",
    ]


def test_vllm_new_wave_drops_the_release_and_restores_the_first_skip() -> None:
    full = vrows(1, 1, running=8, max_bs=1)
    idle = vrows(0, 0, busy=False)
    policies = aligners(dp=2, target_step_lead=2)
    assert play(policies, [full, idle, full, full]) == [
        "HOLD",
        "HOLD",  # the wave ended before round 2: the release is gone
        "HOLD",
        "HOLD",
    ]
    assert policies[0].wave == 1 and policies[0].releases["first_delay_skip"] == 2
    assert policies[0].round == 2


def test_vllm_a_held_prompt_in_an_idle_group_keeps_the_wave_and_fails_open() -> None:
    """Rows with nothing planned but a rank wanting prefill are not the end of a wave (vLLM's
    engines keep running with an unfinished request): the delay count survives them."""
    held = [RankRow(0, 0, 0, True, False, (1, 0, 0)), RankRow(0, 0, 0, False, False, (0, 0, 0))]
    got = play(aligners(dp=2, max_delay_passes=2, target_step_lead=1), [held] * 3)
    assert got == ["HOLD", "HOLD", "ALLOW:max_delay_fail_open"]


def test_vllm_hold_lets_decodes_and_running_chunks_go() -> None:
    policy = aligners(dp=1)[0]
    assert policy.vote(ALL[:1]).permission == CHUNKS_ONLY


# --- ROCm ATOM prefill coalescer (#1611) -------------------------------------------------------


def arow(pf: int, pending: int = 0, gen: int = 4, kv: int = 500, partial: bool = False) -> RankRow:
    """A row with ATOM's columns: prefillable, pending_permille, gen_requests, kv_permille,
    backlog_requests, waiting (backlog - waiting = resident chunks)."""
    waiting = pf
    extras = (pf, pending, gen, kv, waiting + int(partial), waiting)
    return RankRow(4, 4, 0, bool(pf), gen > 0, extras)


def coalescers(dp: int = 4, **config) -> list[AtomCoalescer]:
    """One instance per rank; the table reads the group's decision (``decide``)."""
    return [AtomCoalescer(AtomCoalescerConfig(**config), rank) for rank in range(dp)]


def decide(policy: AtomCoalescer, rounds: list[list[RankRow]]) -> list[str]:
    return [label(policy.decide(rows)) for rows in rounds]


LONE = [arow(1, 100), arow(0), arow(0), arow(0)]


@pytest.mark.parametrize(
    ("rows", "config", "expected"),
    [
        pytest.param([arow(0)] * 4, {}, "ALLOW:vacuous", id="nobody-prefillable"),
        pytest.param([arow(1, gen=0)] + [arow(0, gen=0)] * 3, {}, "ALLOW:nodecode", id="no-dec"),
        pytest.param([arow(1, kv=900)] + [arow(0)] * 3, {}, "ALLOW:kv", id="kv-high"),
        pytest.param([arow(1)] + [arow(0, kv=990)] * 3, {}, "ALIGN", id="kv-high-not-ready"),
        pytest.param(
            [arow(1, kv=100)] + [arow(0)] * 3,
            {"token_usage_low_watermark": 0.3},
            "ALLOW:kv",
            id="kv-low",
        ),
        pytest.param(LONE, {}, "ALIGN", id="alignment-gate"),
        pytest.param([arow(1, 800)] * 4, {}, "ALLOW:fill", id="fill-0.8"),
        pytest.param([arow(1, 700)] * 4, {}, "ALLOW:fill", id="fill-0.7"),
        pytest.param([arow(1, 690)] * 4, {}, "HOLD", id="fill-0.69"),
        pytest.param([arow(1, 300)] * 4, {"target_fill": 0.25}, "ALLOW:fill", id="target"),
    ],
)
def test_atom_one_round(rows: list, config: dict, expected: str) -> None:
    assert decide(coalescers(**config)[0], [rows]) == [expected]


def test_atom_ttft_cap_bounds_the_alignment_hold_and_resets() -> None:
    got = decide(coalescers(ttft_max_ticks=3)[0], [LONE] * 5)
    assert got == ["ALIGN"] * 3 + ["ALLOW:ttft", "ALIGN"]


def test_atom_partial_has_the_tighter_deadline() -> None:
    rows = [arow(1, 100, partial=True)] + [arow(0)] * 3
    got = decide(coalescers(partial_max_ticks=2)[0], [rows] * 3)
    assert got == ["ALIGN", "ALIGN", "ALLOW:partial"]


def test_atom_fill_target_is_reached_as_the_queue_grows() -> None:
    rounds = [[arow(1, p)] * 4 for p in (100, 300, 500, 700)]
    assert decide(coalescers()[0], rounds) == ["HOLD", "HOLD", "HOLD", "ALLOW:fill"]


@pytest.mark.parametrize(
    ("pending", "expected"),
    [
        pytest.param((100,) * 5, ["HOLD"] * 3 + ["ALLOW:stall", "HOLD"], id="flat"),
        pytest.param((100, 100, 150, 150, 150, 150), ["HOLD"] * 5 + ["ALLOW:stall"], id="grew"),
        pytest.param((400, 300, 200, 100), ["HOLD"] * 3 + ["ALLOW:stall"], id="shrinking"),
    ],
)
def test_atom_stall_give_up(pending: tuple, expected: list) -> None:
    """Every rank ready but the forward under-filled: once the pending total has not grown for
    ``stall_ticks`` rounds, waiting longer fills nothing, so it fires."""
    rounds = [[arow(1, p)] * 4 for p in pending]
    assert decide(coalescers(stall_ticks=3)[0], rounds) == expected


def test_atom_fire_admits_only_what_a_rank_published() -> None:
    """The group fires (vacuous: nobody published); a rank whose row said nothing prefillable
    publishes its fresh prompt first, so a lone prompt on a busy group is then held by the
    alignment gate instead of going through as under ``none``."""
    policies = coalescers(ttft_max_ticks=2)
    quiet = [arow(0)] * 4
    published = [arow(1, 100)] + [arow(0)] * 3
    rounds = [quiet, published, published, published]
    votes = [[p.vote(rows) for p in policies] for rows in rounds]
    assert [v[0].open for v in votes] == [False, False, False, True]
    assert [v[0].reason for v in votes] == ["vacuous", "align", "align", "ttft"]
    assert votes[0][0].permission == CHUNKS_ONLY  # fresh prompts wait to be published
    assert votes[1][0].permission == HOLD_ALL  # a hold stops resident chunks too
    assert votes[3][0].permission == ALLOW_ALL
    assert [v.open for v in votes[3]] == [True, False, False, False]  # ranks 1-3: unpublished


@pytest.mark.parametrize(
    ("config", "flag"),
    [
        ({"target_fill": 0.0}, "--atom-coalescer-target-fill"),
        ({"target_fill": 1.5}, "--atom-coalescer-target-fill"),
        ({"ttft_max_ticks": 0}, "--atom-coalescer-ttft-max-ticks"),
        ({"partial_max_ticks": 0}, "--atom-coalescer-partial-max-ticks"),
        ({"stall_ticks": 0}, "--atom-coalescer-stall-ticks"),
        ({"kv_high_watermark": 0.0}, "--atom-coalescer-kv-high-watermark"),
        ({"token_usage_low_watermark": 2.0}, "--atom-coalescer-token-usage-low-watermark"),
    ],
)
def test_atom_config_refusals_name_the_flag(config: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        AtomCoalescerConfig(**config)


# --- TPU inference DP batch prefill (#2577, #2656) ---------------------------------------------


def trow(waiting: int, now: int = 1000, busy: bool = True) -> RankRow:
    """A row with the hold's columns (waiting, now_ms); an idle rank planned nothing."""
    size = 4 if busy else 0
    return RankRow(size, size, 0, waiting > 0, busy, (waiting, now))


def trows(*waiting: int, now: int = 1000, busy: bool = True) -> list[RankRow]:
    return [trow(w, now, busy) for w in waiting]


def play_reads(policies: list, reads: list[list[RankRow]]) -> list[str]:
    """Like ``play``, for tables of the rows each round's vote reads: a round observes the
    rows the next one reads (the last, its own)."""
    out = []
    for i, rows in enumerate(reads):
        votes = {label(policy.vote(rows)) for policy in policies}
        after = reads[i + 1] if i + 1 < len(reads) else rows
        for policy in policies:
            policy.observe(after, read_rows(after))
        assert len(votes) == 1, votes
        out.append(votes.pop())
    return out


def holds(dp: int = 4, **config) -> list[TpuDpHold]:
    return [TpuDpHold(TpuDpHoldConfig(**config), dp, rank) for rank in range(dp)]


def test_tpu_releases_together_once_dp_size_prompts_are_held() -> None:
    """A busy group: prompts trickle in on different ranks; held until dp_size are held
    across the group, then every rank admits on the same round; the count starts again."""
    rounds = [
        trows(1, 0, 0, 0),
        trows(1, 1, 0, 0),
        trows(1, 1, 1, 0),
        trows(1, 1, 1, 1),
        trows(0, 0, 0, 0),  # all admitted on the release round
        trows(0, 1, 0, 0),
    ]
    assert play_reads(holds(), rounds) == ["HOLD"] * 3 + ["ALLOW:batch", "HOLD", "HOLD"]


def test_tpu_batch_counts_prompts_not_ranks() -> None:
    assert play_reads(holds(), [trows(4, 0, 0, 0)]) == ["ALLOW:batch"]


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        pytest.param((1000, 20000, 30999), ["HOLD"] * 3, id="under-30s"),
        pytest.param((1000, 20000, 31000), ["HOLD", "HOLD", "ALLOW:timeout"], id="30s"),
    ],
)
def test_tpu_flush_timeout_releases_a_partial_batch(times: tuple, expected: list) -> None:
    """Fewer than dp_size held: flushed once 30 s of the shared clock have passed since the
    last flush (the clock starts with the first published rows)."""
    rounds = [trows(1, 0, 0, 0, now=t) for t in times]
    assert play_reads(holds(), rounds) == expected


def test_tpu_timeout_runs_from_the_last_flush_not_the_arrival() -> None:
    rounds = [trows(1, 1, 1, 1, now=1000), trows(0, 0, 0, 0, now=2000)]
    rounds.append(trows(1, 0, 0, 0, now=32000))  # first prompt after 31 s: flushed at once
    assert play_reads(holds(), rounds) == ["ALLOW:batch", "HOLD", "ALLOW:timeout"]


def test_tpu_a_flush_restarts_the_timeout() -> None:
    rounds = [trows(0, 0, 0, 0, now=1000), trows(1, 1, 1, 1, now=20000)]
    rounds.append(trows(0, 0, 0, 0, now=21000))  # the flush round's rows: all admitted
    rounds.append(trows(1, 0, 0, 0, now=31000))  # 30 s after the start, 11 s after the flush
    assert play_reads(holds(), rounds) == ["HOLD", "ALLOW:batch", "HOLD", "HOLD"]


def test_tpu_shared_clock_is_the_max_over_ranks() -> None:
    skewed = [trow(1, 1000), trow(0, 1000), trow(0, 31000), trow(0, 1000)]
    assert play_reads(holds(), [trows(1, 0, 0, 0, now=1000), skewed]) == ["HOLD", "ALLOW:timeout"]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param(trows(1, 0, 0, 0, busy=False), "ALLOW:idle", id="idle-group"),
        pytest.param(
            [trow(1), trow(1), trow(0, busy=False), trow(0, busy=False)],
            "ALLOW:idle",
            id="two-idle-two-held",
        ),
        pytest.param(
            [trow(1), trow(1), trow(0), trow(0, busy=False)], "HOLD", id="one-idle-two-held"
        ),
        pytest.param(trows(0, 0, 0, 0, busy=False), "HOLD", id="nothing-held"),
    ],
)
def test_tpu_idle_ranks_take_held_prompts_at_once(rows: list, expected: str) -> None:
    assert play_reads(holds(), [rows]) == [expected]


def test_tpu_dispatched_prompts_are_owed_not_held_again() -> None:
    """Rank 0 could admit only one of its three on the release round: the two left are
    dispatched (its own, admitted as it can) and do not count toward the next batch."""
    policies = holds()
    left = trows(2, 0, 0, 0)  # gathered on the release round: 2 left on rank 0
    for p in policies:
        assert label(p.vote(trows(3, 1, 0, 0))) == "ALLOW:batch"
        p.observe(left, read_rows(left))
    # Next round a new prompt reached rank 1: one held, rank 0 admits what it was dispatched.
    votes = [p.vote(trows(2, 1, 0, 0)) for p in policies]
    assert [label(v) for v in votes] == ["ALLOW:owed", "HOLD", "HOLD", "HOLD"]
    assert policies[1].held(trows(2, 1, 0, 0)) == 1
    for p in policies:
        p.observe(trows(0, 1, 0, 0), read_rows(trows(0, 1, 0, 0)))  # rank 0 drained
    assert label(policies[0].vote(trows(1, 1, 0, 0))) == "HOLD"  # a new one is held again


def test_tpu_hold_lets_resident_chunks_run() -> None:
    vote = holds()[0].vote(trows(1, 0, 0, 0))
    assert vote.permission == CHUNKS_ONLY


def test_tpu_flush_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="--tpu-dp-hold-flush-timeout-ms"):
        TpuDpHoldConfig(flush_timeout_ms=0.0)


# --- registration and the simulator -------------------------------------------------------------


def test_the_newer_peers_are_registered_with_their_flags() -> None:
    assert registry.names()[-3:] == NEWER
    flags = {name: [flag.cli for flag in registry.get(name).flags] for name in NEWER}
    assert flags == {
        "vllm-alignment": [
            "--prefill-alignment-max-delay-passes",
            "--prefill-alignment-target-step-lead",
        ],
        "atom-coalescer": [
            "--atom-coalescer-target-fill",
            "--atom-coalescer-ttft-max-ticks",
            "--atom-coalescer-partial-max-ticks",
            "--atom-coalescer-stall-ticks",
            "--atom-coalescer-kv-high-watermark",
            "--atom-coalescer-token-usage-low-watermark",
        ],
        "tpu-dp-hold": ["--tpu-dp-hold-flush-timeout-ms"],
    }
    ctx = PolicyContext(rank=1, dp_size=4, max_batch_size=8)
    assert registry.build("vllm-alignment", {}, ctx).max_running_requests == 8
    assert registry.build("atom-coalescer", {}, ctx).rank == 1
    assert registry.build("tpu-dp-hold", {}, ctx).threshold == 4


# Poisson arrivals spread by round-robin over 4 ranks: most rounds see one fresh prompt.
SCATTERED = make_spec(num_requests=80, rate=30.0, input_len=120, output_len=24)


@pytest.fixture(scope="module")
def none_summary() -> dict:
    return simulate("none", SCATTERED, costs=PRESETS["h100-dsv3"])


@pytest.mark.parametrize("policy", NEWER)
def test_newer_peer_runs_in_the_simulator_and_is_not_none(policy: str, none_summary) -> None:
    """Each finishes every request and holds prompts that ``none`` lets through at once
    (PEER_POLICIES.md: figures equal to none's mean the port is not doing its job)."""
    summary = simulate(policy, SCATTERED, costs=PRESETS["h100-dsv3"])
    assert summary["unfinished"] == 0
    assert summary["decode_round_fraction"] > none_summary["decode_round_fraction"]
    assert summary["ttft_ms"]["p50"] > none_summary["ttft_ms"]["p50"]
    assert summary["max_admission_wait_rounds"] >= 1
