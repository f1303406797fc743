"""Cost-based rank routing on what the ranks hold (``kv-aware``), and on the gate (``gate-aware``).

Pure policy (no Ray): the Serve router (``deployment.routing.routers``) and the simulator
(``sim.router``) run this same code; only where the ``KvIndex`` is fed from differs.

A choice, in order:

1. session affinity (if on): a session's turns follow its last rank, unless it is overloaded;
2. else the least *cost*, per rank (NVIDIA Dynamo's KV router cost, per DP rank)::

       cost = prefill_weight x uncached prompt tokens on the rank
            + decode_weight  x active KV tokens on the rank (its last report, plus what this
                               router sent it since that report)
            + gate_weight    x [gate-aware only: the prompt does not bring the group closer
                                to an ALL point, while one is still missing]

   The gate term: under the group gate a new prompt waits for an ALL point (every decoding
   rank has prefill backlog) or the ANY bound. A decoding rank *without* backlog blocks ALL;
   a prompt sent there unblocks it, one sent to a rank that already has backlog (or that
   does not decode) leaves every blocker in place, so the prompt, and every other rank's
   waiting prompts, wait on for the ANY bound. A rank counts as having backlog when its last
   report says so or this router sent it a prompt since that report;
3. unless the chosen rank is overloaded against the least-loaded one (by more than
   ``balance_abs_threshold`` requests *and* ``balance_rel_threshold`` times its load): then
   the least-cost rank among those that are not.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from actors.control.page_keys import PageKey, page_keys
from deployment.routing.cache_aware import RouteChoice
from deployment.routing.kv_index import KvIndex

# A lookup of how many leading pages of ``keys`` a rank holds (the index, or the pools
# themselves for the simulator's oracle).
Matcher = Callable[[Hashable, Sequence[PageKey]], int]
# Sessions remembered for affinity, least recently used dropped first.
MAX_SESSIONS = 65536


@dataclass(frozen=True)
class KvRouterConfig:
    """The cost's weights and the load limits (validated: errors name the flag)."""

    page_size: int = 16
    prefill_weight: float = 1.0  # per uncached prompt token (Dynamo's overlap weight: 1)
    decode_weight: float = 0.1  # per active KV token
    gate_aware: bool = False
    gate_weight: float = 4096.0  # tokens: the price of leaving the ALL point blocked
    # A prompt this router sent counts on its rank until a report at least this much newer
    # than the send (the hop to the rank's scheduler and its next plan happen in between).
    sent_hold_s: float = 0.1
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.0001
    session_affinity: bool = False

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"--page-size must be >= 1, got {self.page_size}")
        for name in ("prefill_weight", "decode_weight", "gate_weight", "sent_hold_s"):
            value = getattr(self, name)
            if not value >= 0:  # also refuses NaN
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
        if self.balance_abs_threshold < 0:
            raise ValueError(
                f"--balance-abs-threshold must be >= 0, got {self.balance_abs_threshold}"
            )
        if not self.balance_rel_threshold >= 1.0:
            raise ValueError(
                f"--balance-rel-threshold must be >= 1.0, got {self.balance_rel_threshold}"
            )


class KvCostPolicy:
    """Chooses the least-cost rank for a prompt; remembers what it sent since each report."""

    def __init__(self, config: KvRouterConfig, index: KvIndex | None = None) -> None:
        self.config = config
        self.index = index if index is not None else KvIndex()
        # Per rank: (sent_s, prompt tokens) this router sent, until a report ``sent_hold_s``
        # newer than the send arrives (then the rank's own counts include it).
        self._sent: dict[Hashable, list[tuple[float, int]]] = {}
        self._sessions: dict[str, Hashable] = {}

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
        self._sent.setdefault(rank, []).append((now_s, num_tokens))

    def _costs(
        self, ranks: Sequence[Hashable], matched: Sequence[int], num_tokens: int, now_s: float
    ) -> list[float]:
        cfg = self.config
        index = self.index
        views = []
        for rank in ranks:
            load, load_s = index.load(rank)
            sent = self._sent.get(rank)
            if sent:
                sent = [s for s in sent if s[0] + cfg.sent_hold_s > load_s]
                self._sent[rank] = sent
            views.append((load, sum(t for _, t in sent) if sent else 0))
        costs = []
        for (load, sent_tokens), hit in zip(views, matched, strict=True):
            uncached = max(1, num_tokens - hit * cfg.page_size)
            active = load.active_tokens + load.backlog_tokens + sent_tokens
            costs.append(cfg.prefill_weight * uncached + cfg.decode_weight * active)
        if cfg.gate_aware:
            # Decoding ranks without backlog (sent-to counts as backlog) block the ALL point.
            blocks = [
                load.has_decode_work and not load.wants_prefill and not sent_tokens
                for load, sent_tokens in views
            ]
            # A rank that does not decode yet would, once its prompt is in, block later ALL
            # points: while any rank decodes, new prompts go to the decoding ranks (within
            # the balance thresholds), so the fewest ranks have to fill each ALL point.
            decoding = [load.has_decode_work or bool(sent) for load, sent in views]
            blocked = any(blocks)
            for i, is_blocker in enumerate(blocks):
                if (blocked and not is_blocker) or (not decoding[i] and any(decoding)):
                    costs[i] += cfg.gate_weight
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
