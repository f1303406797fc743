"""What a simulator run records: per request, per round (the timeline), and the run's result."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from roundgate.actors.control.round import RoundKind

if TYPE_CHECKING:
    from roundgate.sim.expert_parallel import ExpertStats

KIND_CODES = {RoundKind.IDLE: 0, RoundKind.DECODE: 1, RoundKind.PREFILL: 2, RoundKind.MIXED: 3}
POINT_CODES = {None: 0, "all": 1, "any": 2}


@dataclass
class Timeline:
    """Per-round record, compact enough for 100k rounds x 8 ranks."""

    start_s: array = field(default_factory=lambda: array("d"))
    duration_ms: array = field(default_factory=lambda: array("d"))
    kinds: bytearray = field(default_factory=bytearray)  # dp_size codes per round
    points: bytearray = field(default_factory=bytearray)  # POINT_CODES
    opened: bytearray = field(default_factory=bytearray)
    # Prompt tokens each rank prefilled, dp_size per round (the regime report's per-rank
    # prefill progress, sim/regime_report.py).
    prefill_tokens: array = field(default_factory=lambda: array("q"))


@dataclass
class RequestRecord:
    rank: int
    arrival_s: float
    prompt_tokens: int
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    num_output: int = 0
    admission_wait: int | None = None
    turn: int = 0  # a session's turn (0: its first, or not a session)
    # Inter-token gaps above the run's ITL SLO (``SimResult.itl_slo_ms``): a request meets an
    # ITL-p99 SLO when at most 1 % of its gaps exceed it (sim/goodput.py). Counted as the
    # tokens come, so no request keeps its gaps.
    slow_gaps: int = 0


@dataclass
class SimResult:
    """Raw outcome of one run; ``roundgate.sim.report`` turns it into tables and plots."""

    policy: str
    dp_size: int
    duration_s: float
    rounds: int
    busy_rounds: int
    prefill_rounds: int
    decode_rounds: int
    records: list[RequestRecord]
    itl_ms: array
    timeline: Timeline | None
    unfinished: int
    # Prompt tokens looked up in the ranks' prefix caches, and those found there.
    prefix_queries: int = 0
    prefix_hits: int = 0
    collections: int = 0  # the engine processes' stop-the-world collections (RoundCosts)
    # The clock after each simulated step and the ITL samples recorded by then: when each
    # sample was taken (to the step), for a steady-state window (sim/steady.py).
    step_end_s: array = field(default_factory=lambda: array("d"))
    step_itl_count: array = field(default_factory=lambda: array("q"))
    # The ITL SLO the records' ``slow_gaps`` were counted against (inf: none counted).
    itl_slo_ms: float = float("inf")
    # The expert placement's balance over the run (None: MoE priced at the mean load).
    experts: ExpertStats | None = None
