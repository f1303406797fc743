"""The decode role's rank choice under P/D: the least decode load, as the ranks report it.

Pure policy (no Ray): the P/D Serve router
(``roundgate.deployment.routing.routers.DecodeLoadRouter``) and the simulator's P/D
(``roundgate.sim.disaggregated``) run this same code; only where the ``KvIndex`` is fed from
differs.

A decode rank's load is what its pool will have to hold: its active KV tokens, the prompt
tokens of the handoffs waiting there for pages (its ``backlog_tokens``: a waiting handoff has
no KV yet), and the prompt tokens of the handoffs this router sent it that it has not
reported receiving yet. That is the kv-aware cost (``roundgate.routing.kv_router``) with no
prefill term and the decode term at weight 1, so ``KvCostPolicy`` computes it, in-flight
settlement and balance thresholds included. What it cannot do is compare a rank that has
reported with one that has not (tokens against nothing): while *no* candidate has a report
(no hub yet, or it went away) the choice falls back to the caller's request counts (Serve's
queue lengths, the simulator's), the least-loaded rule the P/D ingress used before.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from roundgate.actors.control.page_keys import PageKey
from roundgate.routing.cache_aware import RouteChoice
from roundgate.routing.kv_index import KvIndex
from roundgate.routing.kv_router import KvCostPolicy, KvRouterConfig
from roundgate.routing.options import BALANCE
from roundgate.routing.spec import RouterEntry

if TYPE_CHECKING:
    from roundgate.actors.server_args import ServerArgs


class DecodeLoadPolicy:
    """Chooses the decode rank with the least reported decode load (``KvCostPolicy`` with
    the prefill term off); request counts while no candidate has reported."""

    def __init__(self, config: KvRouterConfig | None = None, index: KvIndex | None = None) -> None:
        # Decode load only: no uncached-token term, no gate (a decode group runs none), no
        # sessions (a decode rank is chosen per handoff, after the prefill rank was).
        base = config or KvRouterConfig()
        self.cost = KvCostPolicy(
            replace(
                base,
                prefill_weight=0.0,
                decode_weight=1.0,
                gate_aware=False,
                session_affinity=False,
            ),
            index,
        )
        self.num_fallbacks = 0  # choices made on request counts (no candidate had reported)

    @property
    def index(self) -> KvIndex:
        return self.cost.index

    def choose(
        self,
        ranks: Sequence[Hashable],
        loads: Sequence[float],
        token_ids: Sequence[int],
        now_s: float,
        session: str | None = None,
    ) -> RouteChoice:
        """The decode rank for a handoff of ``token_ids`` (its prompt); ``loads`` are the
        ranks' unfinished requests as the caller counts them, in ``ranks`` order."""
        if not ranks or len(ranks) != len(loads):
            raise ValueError(f"need one load per rank, got {len(ranks)} ranks, {len(loads)}")
        if self.has_report(ranks):
            return self.cost.choose(ranks, loads, token_ids, now_s, match=_no_match)
        self.num_fallbacks += 1
        pick = min(range(len(ranks)), key=lambda i: (loads[i], i))
        # Still on the rank's account: once reports flow it is settled like any send.
        self.cost.note_sent(ranks[pick], len(token_ids), now_s)
        return RouteChoice(ranks[pick], "counts", 0)

    def has_report(self, ranks: Sequence[Hashable]) -> bool:
        """Whether any of ``ranks`` has reported its load."""
        return any(self.index.load(rank)[1] > float("-inf") for rank in ranks)

    def forget(self, ranks: Sequence[Hashable]) -> None:
        """Drop ranks that left (``KvCostPolicy.forget``)."""
        self.cost.forget(ranks)


def _no_match(source: Hashable, keys: Sequence[PageKey]) -> int:
    """Decode load ignores what a rank caches (the prefill term is off): skip the lookup."""
    return 0


def _arguments(values: Mapping[str, Any], engine: ServerArgs) -> dict[str, Any]:
    """The decode ranks' page size and the load limits: no weights (decode load only)."""
    return {"page_size": engine.page_size, **ROUTER.own(values)}


ROUTER = RouterEntry(
    name="decode-load",
    summary="P/D's decode role under router kv-aware: the decode rank with the least reported "
    "decode load",
    options=BALANCE,
    serve_class="roundgate.deployment.routing.routers:DecodeLoadRouter",
    serve=False,  # not a choice of its own: P/D's kv-aware runs it for the decode role
    simulate=False,  # the simulator's P/D builds the policy itself (sim.disaggregated)
    reads_kv_events=True,
    arguments=_arguments,
)
