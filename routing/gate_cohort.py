"""The gate-aware router's view of the group gate: which ranks block the ALL point, how much
prefill a window would put on each rank, and the cohort of ranks that take new prompts.

Pure policy, read by ``roundgate.routing.kv_router`` (the ``gate-aware`` router), on what the live
ingress also has: each rank's last ``RankLoad`` (gate probe, backlog, the gate's counter,
``num_received``) and this router's own unsettled sends.

Under the group gate a new prompt waits for an ALL point (every *decoding* rank has prefill
backlog) or the ANY bound. Two things decide how long:

- *Filling ALL.* A decoding rank without backlog blocks ALL; a prompt sent there unblocks it,
  one sent elsewhere leaves every blocker in place. Round-robin already fills ALL in the best
  order (every rank once per cycle of ``dp`` prompts), so the blocker term only matches it;
  what a router can change is *how many* ranks must be filled. A rank that decodes nothing
  never blocks, so sending every prompt to a cohort of ``k`` ranks lets the others drain and
  an ALL point needs ``k`` prompts instead of ``dp``. Where the arrivals before the last ALL
  point ahead of the ANY bound (``rate x (any - attempt)`` rounds) cannot fill every rank but
  can fill ``gate_cohort_fraction x dp`` of them, the cohort is that many ranks: each decodes
  ``1 / fraction`` times the share it would under round-robin, the ITL this costs. Elsewhere
  the router steps aside to the whole group: the arrivals fill every rank anyway, or not
  even the smallest cohort, so concentrating would cost ITL and open no ALL point.
- *The window's own round.* Every rank prefills its backlog in the same round, which costs
  the largest rank's prefill; so a rank's backlog (reported, plus this router's sends not yet
  received) costs a new prompt at the prefill weight: prompts of one window spread over ranks
  instead of piling on the rank with the least KV.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from roundgate.actors.control.kv_events import RankLoad
from roundgate.routing.spec import Option

GATE_COHORT_FRACTION = Option(
    "gate_cohort_fraction",
    float,
    0.75,
    "the share of ranks that take new prompts where the arrivals cannot give "
    "every rank backlog before the ANY bound but can give this share (1: never concentrate)",
    minimum=0.0,
)

# Rounds of the gate's counter (and the arrivals in them) per rate sample, and the weight of
# a new sample: a cohort follows the load over seconds, not round by round.
RATE_SAMPLE_ROUNDS = 32
# The first sample is short: it only says whether the start is busy enough to fill every
# rank (then a cohort would cost ITL for nothing), and it should say so soon.
FIRST_SAMPLE_ROUNDS = 16
RATE_SMOOTHING = 0.25
# A cohort rank is excluded from new prompts by this much cost; the load limits (balance
# thresholds) still pass an overloaded cohort over, to a rank outside it.
OUTSIDE_COHORT = 1e12
# The cohort shrinks only where this many times the rate, and its inverse, would shrink it.
SHRINK_MARGIN = 1.25


class ArrivalRate:
    """Prompts per gate round the group receives, from the ranks' reports: arrivals per
    second from the sum of their ``num_received`` (every router's sends), rounds per second
    from the gate's counter, which every rank shares, between reads with no window between
    them (a window resets the counter: the rounds across it are unknown)."""

    __slots__ = (
        "_arrivals",
        "_last",
        "_round_seconds",
        "_rounds",
        "_samples",
        "_seconds",
        "first",
        "per_round",
    )

    def __init__(self) -> None:
        self._last: tuple[float, int, int] | None = None  # (time, gate counter, received)
        self._seconds = 0.0
        self._arrivals = 0
        self._round_seconds = 0.0
        self._rounds = 0
        self._samples = 0
        self.first: float | None = None  # the dropped first sample: only grows a cohort
        self.per_round: float | None = None

    def observe(self, now_s: float, rounds_since_prefill: int, received: int) -> None:
        last = self._last
        self._last = (now_s, rounds_since_prefill, received)
        if last is None:
            return
        t0, r0, n0 = last
        dt = now_s - t0
        if received < n0 or dt < 0:  # a rank restarted (its counter went back): start over
            self._seconds = self._round_seconds = 0.0
            self._arrivals = self._rounds = 0
            return
        self._seconds += dt
        self._arrivals += received - n0
        if rounds_since_prefill >= r0:
            self._round_seconds += dt
            self._rounds += rounds_since_prefill - r0
        due = FIRST_SAMPLE_ROUNDS if not self._samples else RATE_SAMPLE_ROUNDS
        if self._rounds >= due and self._seconds > 0:
            sample = (self._arrivals / self._seconds) * (self._round_seconds / self._rounds)
            self._samples += 1
            # The first sample spans the start (reports from before traffic, a group still
            # filling) and is dropped; the second seeds the average.
            if self._samples == 1:
                self.first = sample
            elif self._samples == 2:
                self.per_round = sample
            elif self._samples > 2 and self.per_round is not None:
                self.per_round += RATE_SMOOTHING * (sample - self.per_round)
            self._seconds = self._round_seconds = 0.0
            self._arrivals = self._rounds = 0


def cohort_size(
    num_ranks: int, per_round: float | None, horizon_rounds: int | None, fraction: float
) -> int:
    """How many ranks take new prompts: ``fraction`` of them (at least one) where the
    arrivals expected in ``horizon_rounds`` cannot fill every rank but are within reach of
    that many (within two standard deviations, Poisson: the estimate is noisy, and a miss
    here only means no gain); else, or when the gate has no horizon, the whole group. While
    the rate is unknown, the cohort: it grows at once when the rate asks, while a rank left
    out drains only as its requests finish."""
    floor = max(1, math.ceil(fraction * num_ranks - 1e-9))
    if horizon_rounds is None or floor >= num_ranks:
        return num_ranks
    if per_round is None:
        return floor
    expected = per_round * horizon_rounds
    if expected >= num_ranks or expected + 2.0 * math.sqrt(expected) < floor:
        return num_ranks
    return floor


class Cohort:
    """The cohort's size, sticky: it grows as soon as the rate asks (a cohort too small only
    delays one ALL point), but shrinks only when a rate ``SHRINK_MARGIN`` times higher or
    lower would shrink it too, since a rank dropped from the cohort goes on decoding what it
    holds, and blocks every ALL point, until those requests finish."""

    __slots__ = ("_ranks", "rate", "size")

    def __init__(self) -> None:
        self.rate = ArrivalRate()
        self.size = 0
        self._ranks = 0

    def update(self, num_ranks: int, horizon_rounds: int | None, fraction: float) -> int:
        per_round, first = self.rate.per_round, self.rate.first
        if per_round is None and first is not None and horizon_rounds is not None:
            # Before the rate settles, only a start busy enough to fill every rank with a
            # margin (where a cohort would cost ITL for nothing) is taken from the first
            # sample.
            busy = first * horizon_rounds >= num_ranks * SHRINK_MARGIN
            per_round = first if busy else None
        wanted = cohort_size(num_ranks, per_round, horizon_rounds, fraction)
        if num_ranks != self._ranks or wanted > self.size:
            self.size, self._ranks = wanted, num_ranks
        elif per_round is not None and wanted < self.size:
            lower = max(
                cohort_size(num_ranks, per_round * m, horizon_rounds, fraction)
                for m in (SHRINK_MARGIN, 1.0 / SHRINK_MARGIN)
            )
            self.size = min(self.size, lower)
        return self.size


def add_gate_terms(
    costs: list[float],
    views: Sequence[tuple[RankLoad, int]],
    cohort: int,
    prefill_weight: float,
    gate_weight: float,
) -> None:
    """Add the gate's terms to ``costs`` (one per rank, in ``views`` order: the rank's last
    load and the prompt tokens sent to it and not yet received): the window's backlog at the
    prefill weight, ``gate_weight`` on every cohort rank that does not block ALL while one
    does, and exclusion outside the first ``cohort`` ranks."""
    blocks = [
        i < cohort and load.has_decode_work and not load.wants_prefill and not sent
        for i, (load, sent) in enumerate(views)
    ]
    someone_blocks = any(blocks)
    for i, (load, sent) in enumerate(views):
        costs[i] += prefill_weight * (load.backlog_tokens + sent)
        if someone_blocks and not blocks[i]:
            costs[i] += gate_weight
        if i >= cohort:
            costs[i] += OUTSIDE_COHORT
