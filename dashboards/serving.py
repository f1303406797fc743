"""The serving dashboard: request latencies, KV pressure, prefix caching, queues, throughput,
and the P/D transfer row (KV pages between the roles).

Request latencies are recorded by the ingress (label ``model`` only); queue time, KV
occupancy and the queues are per rank.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from roundgate.dashboards.panels import (
    MODEL,
    RANK,
    Panel,
    dashboard,
    graph,
    percentiles,
    rate,
    ratio_graph,
    watermark_graph,
)

# actors.control.scheduler.PREFILL_WATERMARK: above it a rank stops admitting new prompts (a test
# keeps the two equal; dashboards import nothing from the engine).
PREFILL_WATERMARK = 0.9


def _latency() -> list[Panel]:
    return [
        graph(
            "Time to first token",
            "Arrival at the ingress to the first streamed token.",
            percentiles("roundgate_request_ttft_seconds", MODEL, "model"),
            unit="s",
        ),
        graph(
            "Inter-token latency",
            "Time between two streamed tokens of one request.",
            percentiles("roundgate_request_itl_seconds", MODEL, "model"),
            unit="s",
        ),
        graph(
            "End-to-end latency",
            "Arrival at the ingress to the last token.",
            percentiles("roundgate_request_e2e_seconds", MODEL, "model"),
            unit="s",
        ),
        graph(
            "Queue time",
            "Arrival at the rank to its first prefill chunk (includes the gate's hold).",
            percentiles("roundgate_request_queue_seconds", RANK, "group"),
            unit="s",
        ),
    ]


def _capacity() -> list[Panel]:
    by_rank = "sum by (group, dp_rank)"
    return [
        watermark_graph(
            f"KV occupancy vs the {PREFILL_WATERMARK} watermark",
            "KV pool pages in use per rank; above the red line a rank admits no new prompts.",
            [
                (
                    f"max by (group, dp_rank) (roundgate_rank_kv_occupancy_ratio{{{RANK}}})",
                    "{{group}}/{{dp_rank}}",
                )
            ],
            PREFILL_WATERMARK,
        ),
        ratio_graph(
            "Prefix cache hit rate",
            "Prompt tokens found in the prefix cache over prompt tokens looked up, per rank "
            "(tokens whose K/V were reused instead of prefilled).",
            [
                (
                    f"{rate('roundgate_prefix_cache_hits_total', RANK, 'group, dp_rank')} / "
                    f"{rate('roundgate_prefix_cache_queries_total', RANK, 'group, dp_rank')}",
                    "{{group}}/{{dp_rank}}",
                )
            ],
        ),
        graph(
            "Cached KV pages per rank",
            "Pages holding reusable prefix content, held by a request or evictable.",
            [
                (
                    f"{by_rank} (roundgate_rank_kv_cached_pages{{{RANK}}})",
                    "{{group}}/{{dp_rank}}",
                )
            ],
            unit="none",
        ),
        graph(
            "Running and waiting requests per rank",
            "Resident requests and queued new prompts.",
            [
                (
                    f"{by_rank} (roundgate_rank_running_requests{{{RANK}}})",
                    "{{group}}/{{dp_rank}} running",
                ),
                (
                    f"{by_rank} (roundgate_rank_waiting_requests{{{RANK}}})",
                    "{{group}}/{{dp_rank}} waiting",
                ),
            ],
            unit="none",
        ),
    ]


def _throughput() -> list[Panel]:
    return [
        graph(
            "Finished requests by reason",
            "Requests finished per second, by finish reason.",
            [
                (
                    rate("roundgate_requests_finished_total", MODEL, "model, finish_reason"),
                    "{{model}} {{finish_reason}}",
                )
            ],
            unit="reqps",
            stacked=True,
        ),
        graph(
            "Token throughput",
            "Prompt tokens (of finished requests) and generated tokens per second.",
            [
                (rate("roundgate_prompt_tokens_total", MODEL, "model"), "{{model}} prompt"),
                (
                    rate("roundgate_generation_tokens_total", MODEL, "model"),
                    "{{model}} generation",
                ),
            ],
            unit="cps",
        ),
    ]


def _transfer() -> list[Panel]:
    """P/D disaggregation: KV pages over the link, per role (empty for a fused deployment)."""
    by_role = "group, dp_rank, role"
    legend = "{{group}}/{{dp_rank}} {{role}}"
    return [
        graph(
            "KV transfer pages per second",
            "KV pages sent (prefill role) and received (decode role) over the P/D link.",
            [(rate("roundgate_kv_transfer_pages_total", RANK, by_role), legend)],
            unit="none",
        ),
        graph(
            "KV transfer throughput",
            "Bytes per second over the P/D link, per rank and role.",
            [(rate("roundgate_kv_transfer_bytes_total", RANK, by_role), legend)],
            unit="Bps",
        ),
        graph(
            "KV transfer latency per rank",
            "One request's transfer on a rank: send, or receive and write into reserved pages.",
            percentiles("roundgate_kv_transfer_seconds", RANK, "role"),
            unit="s",
        ),
        graph(
            "KV transfer latency per request",
            "As the ingress sees it (decode rank ready to KV arrived), and the wait for a "
            "decode rank with room (prefill done to pages reserved).",
            [
                *percentiles("roundgate_request_kv_transfer_seconds", MODEL),
                *(
                    (expr, f"decode wait {name}")
                    for expr, name in percentiles("roundgate_request_decode_wait_seconds", MODEL)
                ),
            ],
            unit="s",
        ),
        graph(
            "Requests waiting for decode capacity",
            "Prefilled handoffs holding their pages until a decode rank takes them (prefill), "
            "and handoffs waiting for pages to receive into (decode).",
            [
                (
                    f"sum by ({by_role}) (roundgate_rank_pd_waiting_requests{{{RANK}}})",
                    legend,
                )
            ],
            unit="none",
        ),
        graph(
            "KV transfer failures",
            "Failed transfers per second (each fails its request alone).",
            [(rate("roundgate_kv_transfer_failures_total", RANK, by_role), legend)],
            unit="none",
        ),
        graph(
            "Handoffs released unclaimed",
            "Handoffs a prefill rank released after --handoff-timeout-s with no decode rank "
            "asking for them (their ingress died holding them), per second.",
            [(rate("roundgate_pd_handoffs_expired_total", RANK, by_role), legend)],
            unit="none",
        ),
    ]


def _faults() -> list[Panel]:
    return [
        graph(
            "DP group size (elastic DP)",
            "Live ranks of each group as its last re-form left it (the smallest any of its "
            "ranks reports); below dp_size the group serves degraded while Serve replaces the "
            "lost rank.",
            [(f"min by (group) (roundgate_group_size{{{RANK}}})", "{{group}}")],
            unit="none",
        ),
        graph(
            "Group re-forms",
            "Re-forms per second by reason: fault (a rank died or hung) or join (a "
            "replacement came in), as each rank counts them.",
            [
                (
                    rate("roundgate_group_reforms_total", RANK, "group, reason"),
                    "{{group}} {{reason}}",
                )
            ],
            unit="cps",
        ),
        graph(
            "Experts re-homed per re-form (elastic EP)",
            "Expert slots a MoE group's re-forms filled per second, by source: member (copied "
            "from another member over the new group) or files (no member held a copy: read "
            "from the model's files). With enough redundant experts a lost rank reads no file.",
            [
                (
                    rate("roundgate_experts_rehomed_total", RANK, "group, source"),
                    "{{group}} {{source}}",
                )
            ],
            unit="cps",
        ),
        graph(
            "Expert re-home time",
            "How long each rank's last expert re-home took (the epoch's first forward waits "
            "for it).",
            [(f"max by (group) (roundgate_expert_rehome_seconds{{{RANK}}})", "{{group}}")],
            unit="s",
        ),
        graph(
            "Requests resumed after a rank loss",
            "Rank requests that went on on a live rank: rerouted (before the first token) or "
            "continued (a continuation of the tokens already streamed).",
            [
                (
                    rate("roundgate_requests_resumed_total", MODEL, "model, kind"),
                    "{{model}} {{kind}}",
                )
            ],
            unit="reqps",
        ),
    ]


def build() -> Dashboard:
    """The serving dashboard builder."""
    return dashboard(
        "roundgate-serving",
        "roundgate / serving",
        "Request latencies, KV occupancy, prefix-cache hits, queues and token throughput.",
        [
            ("Latency", _latency()),
            ("Capacity", _capacity()),
            ("Throughput", _throughput()),
            ("P/D transfer", _transfer()),
            ("Faults", _faults()),
        ],
    )
