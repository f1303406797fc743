"""The gate dashboard: how often groups prefill, what the gate voted, what ranks asked for.

A healthy gate shows a high decode-round fraction with prefill rounds in short bursts (the
windows), ALL points opening when every busy rank wants prefill, and ANY points bounding the
wait of a lone prompt. Group-level series come from rank 0 of each group only.

The regime row reads the group as ``roundgate simulate --scenario`` reports it
(``sim/regime_report.py``): LOW when most prefill rounds are mixed *and* the mean window runs
longer than 5 s (SGLang #35241: ranks out of step, some rank always mid-prompt).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from roundgate.dashboards.panels import (
    GROUP,
    RANK,
    Panel,
    dashboard,
    graph,
    percentiles,
    rate,
    ratio_graph,
    state_timeline,
    threshold_line,
    watermark_graph,
)

# Per-rank state code: wants_prefill + 2 * has_decode_work (both are 0/1 gauges).
RANK_STATES = (
    ("idle", "transparent"),
    ("wants prefill", "orange"),
    ("decode", "green"),
    ("decode, wants prefill", "purple"),
)


# sim/regime_report.py's LOW verdict: mixed rounds above this share of the prefill rounds, in
# windows longer than LOW_WINDOW_S on average (a test holds them equal).
LOW_MIXED_FRACTION = 0.5
LOW_WINDOW_S = 5.0


def _max_by_rank(metric: str) -> str:
    return f"max by (group, dp_rank) ({metric}{{{RANK}}})"


def _rounds() -> list[Panel]:
    prefill = rate("roundgate_prefill_rounds_total", GROUP, "group")
    decode = rate("roundgate_decode_rounds_total", GROUP, "group")
    return [
        graph(
            "Prefill-round rate per group",
            "Busy rounds in which some rank extended, per second; all rounds for scale.",
            [
                (prefill, "{{group}} prefill"),
                (rate("roundgate_group_rounds_total", GROUP, "group"), "{{group}} all rounds"),
            ],
            unit="cps",
        ),
        ratio_graph(
            "Decode-round fraction per group",
            "Share of busy rounds in which no rank extended: the group stayed on the "
            "decode CUDA graph and DeepEP low-latency mode.",
            [(f"{decode} / ({decode} + {prefill})", "{{group}}")],
        ),
        graph(
            "Gate votes by point and outcome",
            "Votes at ANY and ALL attempt points, open or closed, and the open votes whose "
            "round actually admitted prefill.",
            [
                (
                    rate("roundgate_gate_votes_total", GROUP, "group, point, outcome"),
                    "{{group}} {{point}} {{outcome}}",
                ),
                (
                    rate("roundgate_gate_windows_admitted_total", GROUP, "group, point"),
                    "{{group}} {{point}} admitted",
                ),
            ],
            unit="cps",
        ),
        graph(
            "Rounds since prefill",
            "The gate's counter: 0 after a prefill round or an all-idle round, +1 otherwise.",
            [(f"max by (group) (roundgate_rounds_since_prefill{{{GROUP}}})", "{{group}}")],
            unit="none",
        ),
        graph(
            "Admission wait",
            "Rounds from a prompt's first published want to its first prefill round.",
            percentiles("roundgate_admission_wait_rounds", RANK, "group"),
            unit="none",
        ),
        graph(
            "MoE rounds: low-latency vs normal",
            "Busy rounds by DeepEP dispatch mode; low-latency iff no rank extended.",
            [(rate("roundgate_moe_rounds_total", GROUP, "group, mode"), "{{group}} {{mode}}")],
            unit="cps",
            stacked=True,
        ),
    ]


def _regime() -> list[Panel]:
    prefill = rate("roundgate_prefill_rounds_total", GROUP, "group")
    windows = rate("roundgate_prefill_windows_total", GROUP, "group")
    extend_s = rate(
        "roundgate_group_round_duration_seconds_sum", f'{GROUP}, kind="extend"', "group"
    )
    spread = rate("roundgate_prefill_progress_bin_spread_chunks_total", GROUP, "group")
    bins = rate("roundgate_prefill_progress_bins_total", GROUP, "group")
    return [
        graph(
            "Gate outcome per round",
            "Every group round once: closed (held while a rank wanted prefill), all / any / "
            "open or the policy's reason (opened and some rank extended), empty (opened for a "
            "rank that wanted prefill, nobody extended), partial (held, yet some rank "
            "extended), no_demand. Per-rank policies are read from rank 0's vote.",
            [
                (
                    rate("roundgate_gate_rounds_total", GROUP, "group, outcome"),
                    "{{group}} {{outcome}}",
                )
            ],
            unit="cps",
            stacked=True,
        ),
        watermark_graph(
            "Mixed share of prefill rounds",
            "Prefill rounds in which another busy rank only decoded (it waits for the "
            f"extending rank's chunk). Above {LOW_MIXED_FRACTION:.0%} with windows longer "
            f"than {LOW_WINDOW_S:g} s: the LOW regime.",
            [(f"{rate('roundgate_mixed_rounds_total', GROUP, 'group')} / {prefill}", "{{group}}")],
            LOW_MIXED_FRACTION,
        ),
        graph(
            "Prefill windows per second",
            "Runs of consecutive rounds in which some rank extended: how often the group "
            "opens for prefill.",
            [(windows, "{{group}}")],
            unit="cps",
        ),
        threshold_line(
            graph(
                "Mean prefill window length",
                "Seconds in prefill rounds per window. A group out of step never returns to "
                f"plain decode rounds: its windows run past {LOW_WINDOW_S:g} s.",
                [(f"{extend_s} / {windows}", "{{group}}")],
                unit="s",
            ),
            LOW_WINDOW_S,
        ),
        graph(
            "Prefill progress spread",
            "Most minus fewest prompt tokens one rank extended in a 5 s bin, in chunks "
            "(--max-scheduled-tokens): the last bin, and the mean over the bins in which "
            "some rank prefilled (the simulator's figure). Ranks in step stay near 0.",
            [
                (
                    f"max by (group) (roundgate_prefill_progress_spread_chunks{{{GROUP}}})",
                    "{{group}} last bin",
                ),
                (f"{spread} / {bins}", "{{group}} mean"),
            ],
            unit="none",
        ),
        graph(
            "Prefill progress per rank",
            "Prompt tokens each rank extended per second; ranks that drift apart by whole "
            "chunks are the LOW regime's sign.",
            [
                (
                    rate("roundgate_rank_prefill_tokens_total", RANK, "group, dp_rank"),
                    "{{group}}/{{dp_rank}}",
                )
            ],
            unit="short",
        ),
    ]


def _ranks() -> list[Panel]:
    return [
        state_timeline(
            "Rank wants prefill / has decode work",
            "The two flags each rank published in the round's gather, as one state per rank.",
            [
                (
                    f"{_max_by_rank('roundgate_rank_wants_prefill')}"
                    f" + 2 * {_max_by_rank('roundgate_rank_has_decode_work')}",
                    "{{group}}/{{dp_rank}}",
                )
            ],
            RANK_STATES,
        ),
        graph(
            "Prefill rounds per rank",
            "Rounds in which the rank itself extended, per second.",
            [
                (
                    rate("roundgate_rank_prefill_rounds_total", RANK, "group, dp_rank"),
                    "{{group}}/{{dp_rank}}",
                )
            ],
            unit="cps",
        ),
        graph(
            "Retractions and aborts per rank",
            "Requests retracted under KV pressure and requests aborted, per second.",
            [
                (
                    rate("roundgate_rank_retractions_total", RANK, "group, dp_rank"),
                    "{{group}}/{{dp_rank}} retracted",
                ),
                (
                    rate("roundgate_rank_aborts_total", RANK, "group, dp_rank"),
                    "{{group}}/{{dp_rank}} aborted",
                ),
            ],
            unit="cps",
        ),
    ]


def _round_time() -> list[Panel]:
    mean_part = (
        f"{rate('roundgate_round_part_duration_seconds_sum', RANK, 'part')}"
        f" / {rate('roundgate_round_part_duration_seconds_count', RANK, 'part')}"
    )
    return [
        graph(
            "Round time breakdown by part",
            "Mean seconds per round in each part: schedule (vote, plan, probe), gather, "
            "forward, finish (observe, update).",
            [(mean_part, "{{part}}")],
            unit="s",
            stacked=True,
        ),
        graph(
            "Round time percentiles",
            "Wall time of one round.",
            percentiles("roundgate_round_duration_seconds", RANK, "group"),
            unit="s",
        ),
    ]


def _experts() -> list[Panel]:
    return [
        ratio_graph(
            "Expert balancedness (EPLB)",
            "Per MoE layer: mean over max routed tokens per rank over the last EPLB window "
            "(1 = every rank computes as many expert tokens; a MoE layer waits for its "
            "busiest rank). The worst layer and the mean of layers per group; measured at "
            "each rebalance, over the placement it replaces.",
            [
                (
                    f"min by (group) (roundgate_expert_balancedness{{{GROUP}}})",
                    "{{group}} worst layer",
                ),
                (
                    f"avg by (group) (roundgate_expert_balancedness{{{GROUP}}})",
                    "{{group}} mean of layers",
                ),
            ],
        ),
        graph(
            "EPLB rebalances and experts moved",
            "Rebalances per second and the expert copies they moved between ranks "
            "(--enable-eplb, every --eplb-interval-rounds rounds).",
            [
                (rate("roundgate_eplb_rebalances_total", GROUP, "group"), "{{group}} rebalances"),
                (
                    rate("roundgate_eplb_experts_moved_total", GROUP, "group"),
                    "{{group}} experts moved",
                ),
            ],
            unit="cps",
        ),
        graph(
            "Last rebalance duration",
            "Wall time the last EPLB rebalance held the group (the load sum, the placement, "
            "the weight moves and the map swap), on rank 0.",
            [
                (
                    f"max by (group) (roundgate_eplb_last_rebalance_seconds{{{GROUP}}})",
                    "{{group}}",
                )
            ],
            unit="s",
        ),
    ]


def _speculative() -> list[Panel]:
    by = "group, dp_rank"
    drafts = rate("roundgate_spec_decode_draft_tokens_total", RANK, by)
    accepted = rate("roundgate_spec_decode_accepted_tokens_total", RANK, by)
    verifies = rate("roundgate_spec_decode_verifies_total", RANK, by)
    return [
        ratio_graph(
            "Draft acceptance rate",
            "Per rank: the share of draft tokens verification kept (--speculative-config). "
            "Low on plain chat (little to copy), high on answers that repeat their prompt.",
            [(f"{accepted} / {drafts}", "{{group}} rank {{dp_rank}}")],
        ),
        graph(
            "Tokens per verification",
            "Per rank: tokens one verifying decode yields, the kept drafts plus its own one "
            "(1 = speculation bought nothing; at most num_speculative_tokens + 1).",
            [(f"1 + {accepted} / {verifies}", "{{group}} rank {{dp_rank}}")],
        ),
    ]


def build() -> Dashboard:
    """The gate dashboard builder."""
    return dashboard(
        "roundgate-gate",
        "roundgate / gate and rounds",
        "Group prefill gate: prefill windows, votes, the regime, rank flags and round time.",
        [
            ("Rounds and the gate", _rounds()),
            ("Regime: healthy or LOW", _regime()),
            ("Ranks", _ranks()),
            ("Round time", _round_time()),
            ("Experts (EPLB)", _experts()),
            ("Speculative decoding", _speculative()),
        ],
    )
