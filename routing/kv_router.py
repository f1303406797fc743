"""Cost-based rank routing on what the ranks hold (``kv-aware``), and on the gate (``gate-aware``).

Pure policy (no Ray): the Serve router (``roundgate.deployment.routing.routers``) and the simulator
(``roundgate.sim.router``) run this same code; only where the ``KvIndex`` is fed from differs. The
``gate-aware`` router (``roundgate.routing.gate_aware``), the simulator's ``oracle`` and P/D's
``decode-load`` are this policy under other settings.

A choice, in order:

1. session affinity (if on): a session's turns follow its last rank, unless it is overloaded;
2. else the least *cost*, per rank (NVIDIA Dynamo's KV router cost, per DP rank)::

       cost = prefill_weight x uncached prompt tokens on the rank
            + decode_weight  x (active KV + backlog tokens on the rank as last reported,
                                + the prompt tokens this router sent it that the rank has
                                not reported receiving yet)
            + [gate-aware only, ``roundgate.routing.gate_cohort``: gate_weight while some rank
            blocks
               the gate's ALL point and this one does not; prefill_weight x the rank's
               backlog, prefilled in the same window round; ranks outside the cohort
               excluded]

   Under the group gate a new prompt waits for an ALL point (every decoding rank has
   backlog) or the ANY bound; a decoding rank *without* backlog blocks ALL, and a prompt sent
   there unblocks it. A rank counts as having backlog when its last report says so or a send
   to it is not yet received. Where the arrivals can fill ALL points on fewer ranks but not
   on all, new prompts keep to a cohort of them and the others drain (``gate_cohort``);
3. unless the chosen rank is overloaded against the least-loaded one (by more than
   ``balance_abs_threshold`` requests *and* ``balance_rel_threshold`` times its load): then
   the least-cost rank among those that are not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from roundgate.actors.control.page_keys import PageKey, page_keys
from roundgate.routing.cache_aware import RouteChoice
from roundgate.routing.gate_cohort import GATE_COHORT_FRACTION, Cohort, add_gate_terms
from roundgate.routing.kv_index import KvIndex
from roundgate.routing.options import (
    BALANCE,
    BALANCE_ABS_THRESHOLD,
    BALANCE_REL_THRESHOLD,
    SESSION_AFFINITY,
    check_balance,
)
from roundgate.routing.spec import Option, RouterEntry, flag

if TYPE_CHECKING:
    from roundgate.actors.server_args import ServerArgs

# A lookup of how many leading pages of ``keys`` a rank holds (the index, or the pools
# themselves for the simulator's oracle).
Matcher = Callable[[Hashable, Sequence[PageKey]], int]

PREFILL_WEIGHT = Option(
    # Dynamo's overlap weight: 1.
    "prefill_weight",
    float,
    1.0,
    "cost per uncached prompt token",
    minimum=0,
)
DECODE_WEIGHT = Option(
    "decode_weight", float, 0.05, "cost per active KV token on the rank", minimum=0
)
GATE_WEIGHT = Option(
    "gate_weight",
    float,
    4096.0,
    "cost, in tokens, of leaving the gate's ALL point blocked",
    minimum=0,
)

# Sessions remembered for affinity, least recently used dropped first.
MAX_SESSIONS = 65536


@dataclass(frozen=True)
class KvRouterConfig:
    """The cost's weights and the load limits (validated: errors name the flag)."""

    page_size: int = 16
    prefill_weight: float = PREFILL_WEIGHT.default
    decode_weight: float = DECODE_WEIGHT.default
    gate_aware: bool = False
    gate_weight: float = GATE_WEIGHT.default
    gate_cohort_fraction: float = GATE_COHORT_FRACTION.default
    # Rounds from the last ALL point before the ANY bound back to the window (the fixed
    # gate's ``any - attempt`` interval): arrivals in them must fill the cohort (None: the
    # ranks' policy has no fixed ANY bound, so no cohort).
    gate_horizon_rounds: int | None = None
    # A prompt this router sent counts on its rank (as load, and as backlog for the gate)
    # until the rank reports having received it, or this long (a rank that restarted).
    max_in_flight_s: float = 5.0
    balance_abs_threshold: int = BALANCE_ABS_THRESHOLD.default
    balance_rel_threshold: float = BALANCE_REL_THRESHOLD.default
    session_affinity: bool = SESSION_AFFINITY.default

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"--page-size must be >= 1, got {self.page_size}")
        for option in (PREFILL_WEIGHT, DECODE_WEIGHT, GATE_WEIGHT, GATE_COHORT_FRACTION):
            option.check(getattr(self, option.name), flag)
        if not self.gate_cohort_fraction <= 1.0:
            raise ValueError(
                f"--gate-cohort-fraction must be <= 1, got {self.gate_cohort_fraction}"
            )
        if self.gate_horizon_rounds is not None and self.gate_horizon_rounds < 1:
            raise ValueError(f"gate_horizon_rounds must be >= 1, got {self.gate_horizon_rounds}")
        if not self.max_in_flight_s >= 0:  # also refuses NaN
            raise ValueError(f"--max-in-flight-s must be >= 0, got {self.max_in_flight_s}")
        check_balance(self.balance_abs_threshold, self.balance_rel_threshold, flag)


class InFlight:
    """Sends to one rank not yet received there, oldest first: the rank's ``num_received``
    counter tells how many arrived since ``base`` (another router's sends to the same rank
    advance it too, so with several routers a send may be settled early: never late)."""

    __slots__ = ("base", "sends")

    def __init__(self, base: int) -> None:
        self.base = base
        self.sends: deque[tuple[float, int]] = deque()  # (sent_s, prompt tokens)

    def settle(self, num_received: int, expire_before_s: float) -> int:
        """Drop the sends the rank received (or too old to wait for); the tokens left."""
        sends = self.sends
        arrived = num_received - self.base
        if arrived < 0:  # the counter went back: a new epoch of the rank
            arrived = len(sends)
        while sends and (arrived > 0 or sends[0][0] < expire_before_s):
            sends.popleft()
            arrived -= 1
            self.base += 1
        if not sends:
            self.base = num_received
        return sum(t for _, t in sends)


class KvCostPolicy:
    """Chooses the least-cost rank for a prompt; remembers what it sent since each report."""

    def __init__(self, config: KvRouterConfig, index: KvIndex | None = None) -> None:
        self.config = config
        self.index = index if index is not None else KvIndex()
        # Per rank: what this router sent that the rank has not reported receiving yet.
        self._sent: dict[Hashable, InFlight] = {}
        self._sessions: dict[str, Hashable] = {}
        self._cohort = Cohort()  # gate-aware: the ranks that take new prompts

    def choose(
        self,
        ranks: Sequence[Hashable],
        loads: Sequence[float],
        token_ids: Sequence[int],
        now_s: float,
        session: str | None = None,
        match: Matcher | None = None,
    ) -> RouteChoice:
        """The rank for a prompt; ``loads`` are the ranks' unfinished requests as the caller
        counts them (the balance thresholds' unit), in ``ranks`` order."""
        if not ranks or len(ranks) != len(loads):
            raise ValueError(f"need one load per rank, got {len(ranks)} ranks, {len(loads)}")
        cfg = self.config
        match = match or self.index.match
        keys = page_keys(token_ids, cfg.page_size)
        n = len(ranks)
        matched = [match(rank, keys) for rank in ranks]
        costs = self._costs(ranks, matched, len(token_ids), now_s)
        least = min(range(n), key=lambda i: (loads[i], i))
        fits = [i for i in range(n) if not self._overloaded(loads[i], loads[least])]
        pinned = self._sessions.get(session) if cfg.session_affinity and session else None
        if pinned in ranks and ranks.index(pinned) in fits:
            pick, reason = ranks.index(pinned), "session"
        else:
            pick = min(fits, key=lambda i: (costs[i], loads[i], i))
            best = min(range(n), key=lambda i: (costs[i], loads[i], i))
            reason = "cost" if pick == best else "balance"
        rank = ranks[pick]
        self.note_sent(rank, len(token_ids), now_s)
        if cfg.session_affinity and session:
            self._sessions.pop(session, None)
            self._sessions[session] = rank
            if len(self._sessions) > MAX_SESSIONS:
                del self._sessions[next(iter(self._sessions))]
        return RouteChoice(rank, reason, matched[pick] * cfg.page_size)

    def note_sent(self, rank: Hashable, num_tokens: int, now_s: float) -> None:
        flight = self._sent.get(rank)
        if flight is None or not flight.sends:
            flight = self._sent[rank] = InFlight(self.index.load(rank)[0].num_received)
        flight.sends.append((now_s, num_tokens))

    def _costs(
        self, ranks: Sequence[Hashable], matched: Sequence[int], num_tokens: int, now_s: float
    ) -> list[float]:
        cfg = self.config
        index = self.index
        views = []
        for rank in ranks:
            load, _ = index.load(rank)
            flight = self._sent.get(rank)
            pending = 0
            if flight is not None and flight.sends:
                pending = flight.settle(load.num_received, now_s - cfg.max_in_flight_s)
            views.append((load, pending))
        costs = []
        for (load, sent_tokens), hit in zip(views, matched, strict=True):
            uncached = max(1, num_tokens - hit * cfg.page_size)
            active = load.active_tokens + load.backlog_tokens + sent_tokens
            costs.append(cfg.prefill_weight * uncached + cfg.decode_weight * active)
        if cfg.gate_aware:
            # routing.gate_cohort: fill the ALL point's blockers, spread a window's backlog,
            # and keep new prompts on a cohort where the arrivals can fill it but not all.
            cohort = self._cohort
            cohort.rate.observe(
                now_s,
                max(load.rounds_since_prefill for load, _ in views),
                sum(load.num_received for load, _ in views),
            )
            k = cohort.update(len(views), cfg.gate_horizon_rounds, cfg.gate_cohort_fraction)
            add_gate_terms(costs, views, k, cfg.prefill_weight, cfg.gate_weight)
        return costs

    def _overloaded(self, load: float, least_load: float) -> bool:
        cfg = self.config
        return (
            load - least_load > cfg.balance_abs_threshold
            and load > least_load * cfg.balance_rel_threshold
        )

    def forget(self, ranks: Sequence[Hashable]) -> None:
        """Drop ranks that left: their index entries and what was sent to them."""
        self.index.forget(ranks)
        for rank in ranks:
            self._sent.pop(rank, None)


def cost_arguments(
    entry: RouterEntry, values: Mapping[str, Any], engine: ServerArgs
) -> dict[str, Any]:
    """``KvRouterConfig``'s fields for a cost router: the ranks' page size (the keys must be
    their pools'), the gate term for the router that reads the gate, its own settings."""
    gate_aware = GATE_WEIGHT in entry.options
    arguments = {"page_size": engine.page_size, "gate_aware": gate_aware, **entry.own(values)}
    delay = engine.prefill_delay
    if gate_aware and delay is not None:
        arguments["gate_horizon_rounds"] = max(1, delay.any_interval - delay.attempt_interval)
    return arguments


ROUTER = RouterEntry(
    name="kv-aware",
    summary="the least-cost rank on what the ranks report holding (their own KV events): "
    "uncached prompt tokens and active KV, within the load limits",
    options=(PREFILL_WEIGHT, DECODE_WEIGHT, *BALANCE, SESSION_AFFINITY),
    serve_class="roundgate.deployment.routing.routers:KvAwareRouter",
    reads_kv_events=True,
    arguments=lambda values, engine: cost_arguments(ROUTER, values, engine),
    # P/D: both on what the ranks report through the KV-event hub, the prefill rank by this
    # cost (uncached prompt tokens, then backlog), the decode rank by decode load.
    pd_roles=("kv-aware", "decode-load"),
)
