"""Cache-aware routing over the ranks of DP groups: send a prompt where its prefix is cached.

Pure policy (no Ray), shared by the Serve router (``roundgate.deployment.routing.routers``) and the
simulator.
The router cannot see the ranks' pools, so it keeps an *approximate* index per rank of the
page keys (``roundgate.actors.control.page_keys``, the same chain the pools use) of the prompts it
sent there, forgetting the least recently routed beyond the rank's pool size, as the pool evicts.

A choice, in order (SGLang router's cache-aware policy, per rank instead of per worker):

1. session affinity (if on): a session's turns follow its last rank;
2. else the rank whose index holds the longest prefix of the prompt (ties: less loaded);
   no match at all: the least-loaded rank;
3. unless the chosen rank is overloaded against the least-loaded one, by more than
   ``balance_abs_threshold`` requests *and* more than ``balance_rel_threshold`` times its load:
   then the least-loaded rank.

A rank that is replaced (a restarted replica, a new id) starts with an empty index, so its old
prefixes stop attracting prompts to it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from roundgate.actors.control.page_keys import PageKey, num_leading, page_keys
from roundgate.routing.options import (
    BALANCE,
    BALANCE_ABS_THRESHOLD,
    BALANCE_REL_THRESHOLD,
    SESSION_AFFINITY,
    check_balance,
)
from roundgate.routing.spec import RouterEntry

if TYPE_CHECKING:
    from roundgate.actors.server_args import ServerArgs


@dataclass(frozen=True)
class CacheAwareConfig:
    """Thresholds and sizes of the cache-aware policy (validated: errors name the field)."""

    page_size: int = 16
    max_pages_per_rank: int = 1024  # the rank's KV pool: the index forgets beyond it
    balance_abs_threshold: int = BALANCE_ABS_THRESHOLD.default
    balance_rel_threshold: float = BALANCE_REL_THRESHOLD.default
    session_affinity: bool = SESSION_AFFINITY.default

    def __post_init__(self) -> None:
        for name in ("page_size", "max_pages_per_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_balance(self.balance_abs_threshold, self.balance_rel_threshold, str)


@dataclass(frozen=True, slots=True)
class RouteChoice:
    """Where a prompt goes, why (``cache``, ``session``, ``least-loaded``, ``balance``), and
    how many of its tokens the index believes are cached there."""

    rank: Hashable
    reason: str
    matched_tokens: int = 0


class PrefixIndex:
    """Per rank, the page keys of what was routed there, least recently routed first."""

    def __init__(self, max_pages_per_rank: int) -> None:
        self.max_pages = max_pages_per_rank
        self._keys: dict[Hashable, OrderedDict[PageKey, None]] = {}

    def match(self, rank: Hashable, keys: Sequence[PageKey]) -> int:
        """Leading pages of ``keys`` the rank is believed to hold."""
        held = self._keys.get(rank)
        return num_leading(keys, held) if held else 0

    def insert(self, rank: Hashable, keys: Sequence[PageKey]) -> None:
        held = self._keys.setdefault(rank, OrderedDict())
        # Tail first, so a prompt's head is the most recent: like the pool, the index lets a
        # sequence's tail go before its (more shared) head.
        for key in reversed(keys):
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.max_pages:
            held.popitem(last=False)

    def keep_only(self, ranks: Sequence[Hashable]) -> None:
        """Forget ranks that are gone (replaced replicas come back under new ids)."""
        live = set(ranks)
        for rank in [r for r in self._keys if r not in live]:
            del self._keys[rank]

    def num_pages(self, rank: Hashable) -> int:
        return len(self._keys.get(rank, ()))


class CacheAwarePolicy:
    """Chooses a rank per prompt and remembers the choice in its prefix index."""

    def __init__(self, config: CacheAwareConfig) -> None:
        self.config = config
        self.index = PrefixIndex(config.max_pages_per_rank)
        self._sessions: dict[str, Hashable] = {}

    def choose(
        self,
        ranks: Sequence[Hashable],
        loads: Sequence[float],
        token_ids: Sequence[int],
        session: str | None = None,
    ) -> RouteChoice:
        """The rank for a prompt of ``token_ids``; ``loads`` are the ranks' unfinished
        requests, in ``ranks`` order (ties go to the earlier rank)."""
        if not ranks or len(ranks) != len(loads):
            raise ValueError(f"need one load per rank, got {len(ranks)} ranks, {len(loads)}")
        cfg = self.config
        self.index.keep_only(ranks)
        if len(self._sessions) > 64 * cfg.max_pages_per_rank:  # bound the affinity table
            self._sessions.clear()
        keys = page_keys(token_ids, cfg.page_size)
        least = min(range(len(ranks)), key=lambda i: loads[i])
        matches = [self.index.match(rank, keys) for rank in ranks]
        pinned = self._sessions.get(session) if cfg.session_affinity and session else None
        if pinned in ranks:
            pick, reason = ranks.index(pinned), "session"
        else:
            pick = max(range(len(ranks)), key=lambda i: (matches[i], -loads[i], -i))
            reason = "cache" if matches[pick] else "least-loaded"
            if not matches[pick]:
                pick = least
        if pick != least and self._overloaded(loads[pick], loads[least]):
            pick, reason = least, "balance"
        rank = ranks[pick]
        self.index.insert(rank, keys)
        if cfg.session_affinity and session:
            self._sessions[session] = rank
        return RouteChoice(rank, reason, matches[pick] * cfg.page_size)

    def _overloaded(self, load: float, least_load: float) -> bool:
        cfg = self.config
        return (
            load - least_load > cfg.balance_abs_threshold
            and load > least_load * cfg.balance_rel_threshold
        )


def _arguments(values: Mapping[str, Any], engine: ServerArgs) -> dict[str, Any]:
    """``CacheAwareConfig``'s fields: the index sized like the ranks' pools."""
    return {
        "page_size": engine.page_size,
        "max_pages_per_rank": engine.num_kv_pages,
        **ROUTER.own(values),
    }


ROUTER = RouterEntry(
    name="cache-aware",
    summary="the rank holding the prompt's longest prefix, by the router's own index of what it "
    "sent where, within the load limits",
    options=(*BALANCE, SESSION_AFFINITY),
    serve_class="roundgate.deployment.routing.routers:CacheAwareRouter",
    arguments=_arguments,
    # P/D: the prefill rank by the ingress's index of what it sent, the decode rank by Serve's
    # request counts.
    pd_roles=("cache-aware", "least-loaded"),
)
