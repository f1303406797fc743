"""Every Prometheus metric of roundgate, defined once (name, type, labels, buckets).

Each process (a rank replica, an ingress replica) builds its metrics into its own
``CollectorRegistry``; ``roundgate.actors.telemetry.metrics_hub`` merges the processes' samples so
one scrape of ``/metrics`` shows every series once. Group-level series (rounds, votes) are identical
on every rank of a group, so only rank 0 of each group exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "roundgate"
ROUND_PARTS = ("schedule", "gather", "forward", "finish")
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
ROUND_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
WAIT_ROUND_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# One request's KV over the P/D link: from a page on loopback to a long prompt across nodes.
TRANSFER_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

GROUP = ("group", "model")
RANK = ("group", "model", "dp_rank")
ROLE = (*RANK, "role")  # P/D series: prefill (sender) or decode (receiver)


def _n(name: str) -> str:
    return f"{PREFIX}_{name}"


@dataclass
class RankMetricSet:
    """The metrics one rank replica exports (group-level ones only on rank 0)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.group_rounds = Counter(
            _n("group_rounds"), "Rounds the DP group ran (busy or idle)", GROUP, registry=r
        )
        self.prefill_rounds = Counter(
            _n("prefill_rounds"),
            "Busy rounds in which some rank extended (num_extends > 0)",
            GROUP,
            registry=r,
        )
        self.decode_rounds = Counter(
            _n("decode_rounds"), "Busy rounds in which no rank extended", GROUP, registry=r
        )
        self.gate_votes = Counter(
            _n("gate_votes"),
            "Gate votes at attempt points",
            (*GROUP, "point", "outcome"),
            registry=r,
        )
        self.gate_windows_admitted = Counter(
            _n("gate_windows_admitted"),
            "Open votes whose round actually admitted prefill",
            (*GROUP, "point"),
            registry=r,
        )
        # The regime, live: the same readings of a round as the simulator's regime report
        # (gate/outcome.py), so a scrape and `roundgate simulate --scenario` agree.
        self.gate_rounds = Counter(
            _n("gate_rounds"),
            "Group rounds by the gate's outcome (they sum to group_rounds): closed (held while "
            "a rank wanted prefill), all/any/open or the policy's reason (opened, some rank "
            "extended), empty (opened for a rank that wanted prefill, nobody extended), "
            "partial (held, yet some rank extended), no_demand (nobody wanted prefill)",
            (*GROUP, "outcome"),
            registry=r,
        )
        self.mixed_rounds = Counter(
            _n("mixed_rounds"),
            "Rounds in which some rank extended while another busy rank only decoded",
            GROUP,
            registry=r,
        )
        self.prefill_windows = Counter(
            _n("prefill_windows"),
            "Prefill windows: runs of consecutive rounds in which some rank extended",
            GROUP,
            registry=r,
        )
        self.progress_spread = Gauge(
            _n("prefill_progress_spread_chunks"),
            "Most minus fewest prompt tokens one rank of the group extended in the last 5 s "
            "bin, in chunks (--max-scheduled-tokens); 0 when nobody prefilled in it",
            GROUP,
            registry=r,
        )
        self.progress_bins = Counter(
            _n("prefill_progress_bins"),
            "5 s bins in which some rank of the group extended",
            GROUP,
            registry=r,
        )
        self.progress_bin_spread = Counter(
            _n("prefill_progress_bin_spread_chunks"),
            "The progress spread of each bin counted by prefill_progress_bins, in chunks, "
            "summed (over that count: the simulator's progress spread)",
            GROUP,
            registry=r,
        )
        self.rounds_since_prefill = Gauge(
            _n("rounds_since_prefill"),
            "The gate's counter of rounds since the last prefill",
            GROUP,
            registry=r,
        )
        self.moe_rounds = Counter(
            _n("moe_rounds"),
            "Busy rounds by MoE dispatch mode (low_latency iff no extend)",
            (*GROUP, "mode"),
            registry=r,
        )
        # EPLB (--enable-eplb): the group's expert balance as the last rebalance measured it
        # (vLLM's balancedness: mean over max routed tokens per rank, over the window that
        # rebalance closed; 1 is even), the rebalances and the experts they moved between
        # ranks, and how long the last one held the group. Group-level, from rank 0.
        self.expert_balancedness = Gauge(
            _n("expert_balancedness"),
            "Mean over max routed tokens per rank in the last EPLB window, per MoE layer",
            (*GROUP, "moe_layer"),
            registry=r,
        )
        self.eplb_rebalances = Counter(
            _n("eplb_rebalances"), "EPLB rebalances the group ran", GROUP, registry=r
        )
        self.eplb_experts_moved = Counter(
            _n("eplb_experts_moved"),
            "Expert copies (layer, slot) whose weights an EPLB rebalance moved between ranks",
            GROUP,
            registry=r,
        )
        self.eplb_rebalance_seconds = Gauge(
            _n("eplb_last_rebalance_seconds"),
            "Wall time of the last EPLB rebalance (window sum, placement, weight moves, swap)",
            GROUP,
            registry=r,
        )
        self.wants_prefill = Gauge(
            _n("rank_wants_prefill"), "Published wants_prefill (0/1)", RANK, registry=r
        )
        self.has_decode_work = Gauge(
            _n("rank_has_decode_work"), "Published has_decode_work (0/1)", RANK, registry=r
        )
        self.running = Gauge(_n("rank_running_requests"), "Resident requests", RANK, registry=r)
        self.waiting = Gauge(_n("rank_waiting_requests"), "Queued new prompts", RANK, registry=r)
        self.kv_occupancy = Gauge(
            _n("rank_kv_occupancy_ratio"), "KV pool pages in use, 0..1", RANK, registry=r
        )
        # 1 on the weight path the rank's linear layers run (--gguf-weights after the CPU and
        # compiler had their say): packed, int8-dot or float.
        self.weight_path = Gauge(
            _n("rank_weight_path"),
            "Weight path of the rank's linear layers (1 on the one in use)",
            (*RANK, "path"),
            registry=r,
        )
        # 1 on the prefill policy the rank runs (--prefill-policy, or the one its flags imply):
        # a scrape says which policy produced the gate's series next to it.
        self.prefill_policy = Gauge(
            _n("rank_prefill_policy"),
            "Prefill policy the rank runs (1 on the one in use)",
            (*RANK, "policy"),
            registry=r,
        )
        # Elastic DP: the live ranks of the rank's group as this rank last re-formed it, and
        # the re-forms it went through by why ("fault": a member died or hung; "join": a
        # replacement came in). A degraded group shows size < its dp_size.
        self.group_size = Gauge(
            _n("group_size"), "Live ranks of the rank's DP group (elastic DP)", RANK, registry=r
        )
        self.group_reforms = Counter(
            _n("group_reforms"),
            "Re-forms of the rank's DP group (elastic DP)",
            (*RANK, "reason"),
            registry=r,
        )
        # Elastic EP: at each (re)formed epoch of a MoE group the experts are re-homed over
        # the members: expert copies (slots, group-wide) filled from another member, and read
        # from the model's files because no member held a copy; the last re-home's duration.
        self.experts_rehomed = Counter(
            _n("experts_rehomed"),
            "Expert slots a MoE group's re-form filled, by source: member (another member's "
            "copy) or files (no copy survived; read from the model's files)",
            (*RANK, "source"),
            registry=r,
        )
        self.expert_rehome_seconds = Gauge(
            _n("expert_rehome_seconds"),
            "Wall time of the rank's last expert re-home (a MoE group's re-form)",
            RANK,
            registry=r,
        )
        # vLLM's prefix_cache_queries / prefix_cache_hits, in tokens: hits / queries is the
        # rank's hit rate.
        self.prefix_cache_queries = Counter(
            _n("prefix_cache_queries"),
            "Prompt tokens looked up in the prefix cache at admission",
            RANK,
            registry=r,
        )
        self.prefix_cache_hits = Counter(
            _n("prefix_cache_hits"),
            "Prompt tokens found in the prefix cache (their K/V reused, not computed)",
            RANK,
            registry=r,
        )
        self.kv_cached_pages = Gauge(
            _n("rank_kv_cached_pages"),
            "KV pages holding reusable prefix content (held or evictable)",
            RANK,
            registry=r,
        )
        self.retractions = Counter(
            _n("rank_retractions"), "Requests retracted under KV pressure", RANK, registry=r
        )
        self.aborts = Counter(_n("rank_aborts"), "Requests aborted on the rank", RANK, registry=r)
        self.spec_verifies = Counter(
            _n("spec_decode_verifies"),
            "Speculative decoding: decodes that verified at least one draft token",
            RANK,
            registry=r,
        )
        self.spec_draft_tokens = Counter(
            _n("spec_decode_draft_tokens"), "Draft tokens verified", RANK, registry=r
        )
        self.spec_accepted_tokens = Counter(
            _n("spec_decode_accepted_tokens"),
            "Draft tokens verification kept (the acceptance rate: this over draft tokens; "
            "tokens per verification: 1 + this over verifies)",
            RANK,
            registry=r,
        )
        self.spec_acceptance_rate = Gauge(
            _n("spec_decode_acceptance_rate"),
            "Draft tokens kept over draft tokens verified, since the rank started",
            RANK,
            registry=r,
        )
        self.spec_mean_accepted_length = Gauge(
            _n("spec_decode_mean_accepted_length"),
            "Tokens a verification yields on average (its kept drafts plus its own token), "
            "since the rank started",
            RANK,
            registry=r,
        )
        self.local_prefill_rounds = Counter(
            _n("rank_prefill_rounds"), "Rounds in which this rank extended", RANK, registry=r
        )
        self.local_prefill_tokens = Counter(
            _n("rank_prefill_tokens"),
            "Prompt tokens this rank extended (its prefill progress)",
            RANK,
            registry=r,
        )
        self.admission_wait = Histogram(
            _n("admission_wait_rounds"),
            "Rounds from a prompt's first published want to its first prefill round",
            RANK,
            buckets=WAIT_ROUND_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            _n("request_queue_seconds"),
            "Arrival at the rank to the first prefill chunk",
            RANK,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.round_time = Histogram(
            _n("round_duration_seconds"),
            "Wall time of one round",
            RANK,
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        # Group level (rank 0): what ``roundgate calibrate`` turns into decode/extend costs.
        self.group_round_time = Histogram(
            _n("group_round_duration_seconds"),
            "Wall time of one busy group round, gather to gather (the slowest rank's forward "
            "included), by kind (decode: nobody extends)",
            (*GROUP, "kind"),
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        # What the busiest rank carried in those rounds, summed: with the round time's sum and
        # count, the per-sequence and per-prefill-token costs ``roundgate calibrate`` fits.
        self.group_round_work = Counter(
            _n("group_round_work"),
            "Per busy group round, the largest amount of each quantity on one rank (decodes: "
            "decoding sequences; prefill_tokens: prompt tokens extended), summed, by kind",
            (*GROUP, "kind", "quantity"),
            registry=r,
        )
        self.round_part_time = Histogram(
            _n("round_part_duration_seconds"),
            "Wall time of one part of a round (schedule = vote+plan+probe, gather, forward, "
            "finish = observe+update)",
            (*RANK, "part"),
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        # P/D disaggregation: KV pages over the link, per role (a fused rank exports none).
        self.kv_transfer_pages = Counter(
            _n("kv_transfer_pages"),
            "KV pages moved over the P/D link: sent (prefill role) or received (decode role)",
            ROLE,
            registry=r,
        )
        self.kv_transfer_bytes = Counter(
            _n("kv_transfer_bytes"), "KV bytes moved over the P/D link", ROLE, registry=r
        )
        self.kv_transfer_time = Histogram(
            _n("kv_transfer_seconds"),
            "Wall time of one request's KV transfer on this rank (send, or receive and write "
            "into the reserved pages)",
            ROLE,
            buckets=TRANSFER_BUCKETS,
            registry=r,
        )
        self.kv_transfer_failures = Counter(
            _n("kv_transfer_failures"),
            "KV transfers that failed (that request alone fails)",
            ROLE,
            registry=r,
        )
        self.pd_handoffs_expired = Counter(
            _n("pd_handoffs_expired"),
            "Handoffs a prefill rank released on its own: no decode rank asked for their "
            "pages within --handoff-timeout-s (their ingress died or left them)",
            ROLE,
            registry=r,
        )
        self.pd_waiting = Gauge(
            _n("rank_pd_waiting_requests"),
            "Requests waiting for decode capacity: prefilled handoffs holding their pages until "
            "a decode rank takes them (prefill role), handoffs waiting for pages to receive "
            "into (decode role)",
            ROLE,
            registry=r,
        )


@dataclass
class RequestMetricSet:
    """Request latencies and token counts, recorded by the ingress."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r, labels = self.registry, ("model",)
        self.ttft = Histogram(
            _n("request_ttft_seconds"),
            "Time to first token",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            _n("request_itl_seconds"),
            "Inter-token latency",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            _n("request_e2e_seconds"),
            "End-to-end request latency",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            _n("prompt_tokens"), "Prompt tokens of finished requests", labels, registry=r
        )
        self.generation_tokens = Counter(
            _n("generation_tokens"), "Generated tokens", labels, registry=r
        )
        self.kv_transfer_time = Histogram(
            _n("request_kv_transfer_seconds"),
            "P/D: one request's KV transfer as the ingress sees it (decode rank ready to "
            "receive to KV arrived), the decode rank's wait for capacity excluded",
            labels,
            buckets=TRANSFER_BUCKETS,
            registry=r,
        )
        self.decode_wait = Histogram(
            _n("request_decode_wait_seconds"),
            "P/D: prefill done (handoff ready) to a decode rank holding pages for it",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.finished = Counter(
            _n("requests_finished"),
            "Finished requests by reason",
            (*labels, "finish_reason"),
            registry=r,
        )
        # Rank requests that went on after their rank was lost (``roundgate.deployment.resume``),
        # counted when the resumed attempt's first chunk arrives, by kind: ``rerouted`` (no token
        # yet, the request whole) or ``continued`` (a sequence with tokens already streamed).
        self.requests_resumed = Counter(
            _n("requests_resumed"),
            "Rank requests resumed on a live rank after their rank was lost, by kind "
            "(rerouted: before the first token; continued: as a continuation of the tokens "
            "streamed)",
            (*labels, "kind"),
            registry=r,
        )
