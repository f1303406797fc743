"""Records one rank's rounds into its ``RankMetricSet`` (on the engine thread)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from roundgate.actors.control.rank_loop import RoundOutcome, RoundParts
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.telemetry.metrics import ROUND_PARTS, RankMetricSet
from roundgate.actors.telemetry.regime_metrics import RegimeMetrics
from roundgate.gate.rows import RankRow

if TYPE_CHECKING:  # the model's module (torch) is not the telemetry's import
    from roundgate.actors.model.expert_balance import RebalanceReport
    from roundgate.actors.model.expert_rehome import RehomeReport

WORK_QUANTITIES = ("decodes", "prefill_tokens")


def busiest_work(rows: Sequence[RankRow]) -> tuple[int, int]:
    """The most decoding sequences and the most prompt tokens any one rank ran this round
    (a decode is one token of ``num_tokens``; the rest of it is prompt)."""
    decodes = prefill = 0
    for row in rows:
        d = row.batch_size - row.num_extends
        decodes = max(decodes, d)
        prefill = max(prefill, row.num_tokens - d)
    return decodes, prefill


class RankMetrics:
    """Per-round bookkeeping; group-level series only on rank 0 (they are identical)."""

    def __init__(self, group: str, model: str, rank: int, metrics: RankMetricSet | None = None):
        self.set = metrics or RankMetricSet()
        self.rank = rank
        # This rank's place in the gathered rows: ``rank`` in a gang; in an elastic group its
        # place in the current epoch, which a re-form changes (``note_group``).
        self.row_rank = rank
        s, g, r = self.set, (group, model), (group, model, str(rank))
        self._labels = r
        self.is_group_exporter = rank == 0
        # Bound children: label lookups happen once, not every round. Group series are bound
        # (and so exist) only on the exporting rank.
        if self.is_group_exporter:
            self._group_rounds = s.group_rounds.labels(*g)
            self._prefill_rounds = s.prefill_rounds.labels(*g)
            self._decode_rounds = s.decode_rounds.labels(*g)
            self._since = s.rounds_since_prefill.labels(*g)
            self._moe = {m: s.moe_rounds.labels(*g, m) for m in ("low_latency", "normal")}
            self._votes = {
                (p, o): s.gate_votes.labels(*g, p, o)
                for p in ("any", "all")
                for o in ("open", "closed")
            }
            self._windows = {p: s.gate_windows_admitted.labels(*g, p) for p in ("any", "all")}
            self._kind_time = {k: s.group_round_time.labels(*g, k) for k in ("decode", "extend")}
            self._work = {
                (k, q): s.group_round_work.labels(*g, k, q)
                for k in ("decode", "extend")
                for q in WORK_QUANTITIES
            }
            self._regime = RegimeMetrics(s, group, model)
        self._wants = s.wants_prefill.labels(*r)
        self._decodes = s.has_decode_work.labels(*r)
        self._running = s.running.labels(*r)
        self._waiting = s.waiting.labels(*r)
        self._kv = s.kv_occupancy.labels(*r)
        self._retractions = s.retractions.labels(*r)
        self._spec = (
            s.spec_verifies.labels(*r),
            s.spec_draft_tokens.labels(*r),
            s.spec_accepted_tokens.labels(*r),
        )
        self._spec_ratios = (
            s.spec_acceptance_rate.labels(*r),
            s.spec_mean_accepted_length.labels(*r),
        )
        self._seen_spec = (0, 0, 0)
        self._aborts = s.aborts.labels(*r)
        self._prefix_queries = s.prefix_cache_queries.labels(*r)
        self._prefix_hits = s.prefix_cache_hits.labels(*r)
        self._cached_pages = s.kv_cached_pages.labels(*r)
        self._local_prefill = s.local_prefill_rounds.labels(*r)
        self._local_prefill_tokens = s.local_prefill_tokens.labels(*r)
        self._admission = s.admission_wait.labels(*r)
        self._queue = s.queue_time.labels(*r)
        self._round_time = s.round_time.labels(*r)
        self._parts = {p: s.round_part_time.labels(*r, p) for p in ROUND_PARTS}
        self._arrivals: dict[str, float] = {}
        # The busy round whose end the next gather marks: (kind, decodes, prefill tokens).
        self._pending: tuple[str, int, int] | None = None
        self._gathered_at = 0.0
        self._seen_retractions = 0
        self._seen_aborts = 0
        self._seen_prefix = (0, 0)
        self._last_rebalance: RebalanceReport | None = None
        self._group = g

    def note_weight_path(self, path: str) -> None:
        """Which weights the rank's linear layers run on (``ModelRunner.weight_path``)."""
        self.set.weight_path.labels(*self._labels, path).set(1)

    def note_prefill_policy(self, name: str) -> None:
        """Which prefill policy the rank runs (``ServerArgs.prefill_policy_name``)."""
        self.set.prefill_policy.labels(*self._labels, name).set(1)

    def note_group(self, size: int, reason: str | None, row_rank: int) -> None:
        """The rank's group as an elastic re-form left it (``reason`` None: its first), and
        the rank's place in the new group's rows."""
        self.row_rank = row_rank
        self.set.group_size.labels(*self._labels).set(size)
        if reason is not None:
            self.set.group_reforms.labels(*self._labels, reason).inc()

    def note_rehome(self, report: RehomeReport) -> None:
        """A MoE group's expert re-home at a (re)formed epoch (``RankEngine.rehome``): its
        duration on this rank; its counts (the group's, alike on every member) once, by the
        epoch's first row."""
        s, r = self.set, self._labels
        s.expert_rehome_seconds.labels(*r).set(report.seconds)
        if self.row_rank == 0:
            s.experts_rehomed.labels(*r, "member").inc(report.experts_transferred)
            s.experts_rehomed.labels(*r, "files").inc(report.experts_loaded)

    def note_rebalance(self, report: RebalanceReport | None) -> None:
        """The rank's last EPLB rebalance (``ExpertBalancer.last``), recorded once; rank 0
        exports it for the group (every rank computed the same placement)."""
        if report is None or report is self._last_rebalance:  # (a regroup's new balancer
            return  # counts from 1 again: the report itself says whether it is new)
        self._last_rebalance = report
        if not self.is_group_exporter:
            return
        s, g = self.set, self._group
        s.eplb_rebalances.labels(*g).inc()
        s.eplb_experts_moved.labels(*g).inc(report.experts_moved)
        s.eplb_rebalance_seconds.labels(*g).set(report.seconds)
        for layer, value in enumerate(report.balancedness):
            s.expert_balancedness.labels(*g, str(layer)).set(value)

    def note_arrival(self, request_id: str) -> None:
        self._arrivals[request_id] = time.monotonic()

    def observe(
        self,
        outcome: RoundOutcome,
        scheduler: Scheduler,
        parts: RoundParts,
        rounds_since_prefill: int | None,
    ) -> None:
        rows, view = outcome.rows, outcome.view
        busy, any_extend = view.busy, view.any_extend
        if self.is_group_exporter:
            self._group_round(busy, any_extend, rows, parts.gathered_at)
            self._group_rounds.inc()
            if busy:
                (self._prefill_rounds if any_extend else self._decode_rounds).inc()
                self._moe["normal" if any_extend else "low_latency"].inc()
            vote = outcome.vote
            if vote.point is not None:
                self._votes[(vote.point, "open" if vote.open else "closed")].inc()
                if vote.open and any_extend:
                    self._windows[vote.point].inc()
            if rounds_since_prefill is not None:
                self._since.set(rounds_since_prefill)
            self._regime.observe(outcome, parts.gathered_at, scheduler.config.max_scheduled_tokens)
        mine = rows[self.row_rank]
        self._wants.set(int(mine.wants_prefill))
        self._decodes.set(int(mine.has_decode_work))
        self._running.set(len(scheduler.queues.running))
        self._waiting.set(len(scheduler.queues.waiting))
        self._kv.set(scheduler.pool.occupancy)
        self._cached_pages.set(scheduler.pool.num_cached_pages)
        self._count(scheduler)
        if outcome.plan.num_extends:
            self._local_prefill.inc()
            self._local_prefill_tokens.inc(outcome.plan.num_prefill_tokens)
            now = time.monotonic()
            for chunk in outcome.plan.chunks:
                # A prompt's first chunk (with prefix caching it may start past 0).
                if chunk.is_prefill and chunk.request.first_prefill_round == scheduler.round:
                    arrival = self._arrivals.pop(chunk.request.request_id, None)
                    if arrival is not None:
                        self._queue.observe(now - arrival)
                    wait = scheduler.admission_wait(chunk.request)
                    if wait is not None:
                        self._admission.observe(wait)
        for event in outcome.events:
            if event.finished:
                self._arrivals.pop(event.request.request_id, None)
        if busy:
            self._round_time.observe(parts.total)
            for name, seconds in parts.as_dict().items():
                self._parts[name].observe(seconds)

    def _group_round(
        self, busy: bool, any_extend: bool, rows: Sequence[RankRow], gathered_at: float
    ) -> None:
        """Record the previous busy round, now that this round's gather has ended it.

        A group round runs from one gather to the next: its length is the slowest rank's
        forward (plus plans and the collective), which is what the simulator prices. This
        rank's own parts would charge a slow peer's forward to the round after it (the wait
        happens in the next gather), so the group series use the gather-to-gather interval.
        """
        pending = self._pending
        if pending is not None:
            kind, decodes, prefill = pending
            self._kind_time[kind].observe(max(0.0, gathered_at - self._gathered_at))
            self._work[(kind, "decodes")].inc(decodes)
            self._work[(kind, "prefill_tokens")].inc(prefill)
        self._pending = None
        if busy:
            self._pending = ("extend" if any_extend else "decode", *busiest_work(rows))
        self._gathered_at = gathered_at

    def _count(self, scheduler: Scheduler) -> None:
        if scheduler.num_retractions > self._seen_retractions:
            self._retractions.inc(scheduler.num_retractions - self._seen_retractions)
            self._seen_retractions = scheduler.num_retractions
        speculator = scheduler.planner.speculator
        if speculator is not None:
            stats = speculator.stats
            now = (stats.verifies, stats.drafts, stats.accepted)
            if now != self._seen_spec:
                for counter, new, old in zip(self._spec, now, self._seen_spec, strict=True):
                    counter.inc(new - old)
                self._seen_spec = now
                rate, length = self._spec_ratios
                rate.set(stats.acceptance_rate)
                length.set(stats.mean_accepted)
        if scheduler.num_aborts > self._seen_aborts:
            self._aborts.inc(scheduler.num_aborts - self._seen_aborts)
            self._seen_aborts = scheduler.num_aborts
        prefix = scheduler.prefix
        seen_queries, seen_hits = self._seen_prefix
        if prefix.num_queries > seen_queries:
            self._prefix_queries.inc(prefix.num_queries - seen_queries)
            self._prefix_hits.inc(prefix.num_hits - seen_hits)
            self._seen_prefix = (prefix.num_queries, prefix.num_hits)
