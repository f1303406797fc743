"""What a rank tells the routers about its load and gate state (``RankLoad``), read off its
scheduler. Apart from the scheduler: only the KV-event publishers need it."""

from __future__ import annotations

from roundgate.actors.control.kv_events import RankLoad
from roundgate.actors.control.scheduler import Scheduler


def rank_load(scheduler: Scheduler, rounds_since_prefill: int | None = None) -> RankLoad:
    """The rank's load as of now: queue lengths, backlog and active KV tokens, the gate probe."""
    probe = scheduler.probe()
    pool = scheduler.pool
    # A decode rank's requests arrive as handoffs, through its KV connector, not as prompts.
    received = scheduler.num_received + scheduler.connector.num_received
    return RankLoad(
        len(scheduler.queues.running),
        len(scheduler.queues.waiting),
        sum(r.num_uncomputed_prompt_tokens for r in scheduler.queues.waiting),
        pool.num_used_pages * pool.page_size,
        probe.wants_prefill,
        probe.has_decode_work,
        rounds_since_prefill or 0,
        received,
    )
