"""The extra gather columns a policy may ask for, read from one rank's scheduler.

Peer policies (PEER_POLICIES.md) decide on more than the gate's five columns: SGLang reads KV
usage, queue lengths and a "prefillable" flag, TRT-LLM the context/generation counts. Each is
an int read right after the plan (the same moment as the published probe), appended to the
rank's row of the one metadata gather. Unknown names are refused when the loop is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from roundgate.actors.control.scheduler import Scheduler

ColumnReader = Callable[[Scheduler, float], int]


def _prefillable(s: Scheduler) -> int:
    # A rank mid-chunk says 1; otherwise only if it would get past its admission checks.
    return int(s.num_resident_chunks > 0 or s.can_admit)


def _ctx_requests(s: Scheduler) -> int:
    q = s.queues
    new = min(len(q.waiting), s.max_batch_size - len(q.running)) if s.can_admit else 0
    return s.num_resident_chunks + new


def _head_wait_rounds(s: Scheduler) -> int:
    # Rounds since the oldest held prompt (queue head or a resident chunk) was first published.
    first = [r.first_want_round for r in s.queues.partial if r.first_want_round is not None]
    if s.queues.waiting and s.queues.waiting[0].first_want_round is not None:
        first.append(s.queues.waiting[0].first_want_round)
    return s.round - min(first) if first else 0


def _head_tokens(s: Scheduler) -> int:
    # Prompt tokens still to compute of the oldest held prompt (the one ``head_wait_rounds``
    # dates): what its own prefill will take, for a policy pricing its wait against that.
    held = [r for r in s.queues.partial if r.first_want_round is not None]
    if s.queues.waiting and s.queues.waiting[0].first_want_round is not None:
        held.append(s.queues.waiting[0])
    if not held:
        return 0
    return min(held, key=lambda r: r.first_want_round).num_uncomputed_prompt_tokens


def _backlog_tokens(s: Scheduler) -> int:
    # Prompt tokens the rank still has to prefill: resident chunks' rest and queued prompts.
    tokens = sum(r.num_uncomputed_prompt_tokens for r in s.queues.partial)
    return tokens + sum(r.num_prompt_tokens for r in s.queues.waiting)


def _spec_accepted(s: Scheduler) -> int:
    # Drafts verification kept on this rank since it started (0 without speculation): the
    # group's total grows by what a round's verifications kept, so a policy reads the tokens
    # a decode yields per round from the gathered rows (roundgate.gate.decode_yield).
    speculator = s.planner.speculator
    return 0 if speculator is None else speculator.stats.accepted


def _backlog_rounds(s: Scheduler) -> int:
    # Open rounds the rank's prefill backlog needs at its token budget (ceil).
    return -(-_backlog_tokens(s) // s.config.max_scheduled_tokens)


def _pending_permille(s: Scheduler) -> int:
    # ATOM's fill signal: the prefill tokens the rank owes (queued prompts and the remainder of
    # its resident chunks), capped at one round's token budget, in thousandths of that budget.
    tokens = sum(r.num_uncomputed_prompt_tokens for r in s.queues.partial)
    tokens += sum(r.num_prompt_tokens for r in s.queues.waiting)
    return min(1000, tokens * 1000 // s.config.max_scheduled_tokens)


READERS: dict[str, ColumnReader] = {
    "prefillable": lambda s, now: _prefillable(s),
    "kv_permille": lambda s, now: s.pool.num_used_pages * 1000 // s.pool.num_pages,
    "running": lambda s, now: len(s.queues.running),
    "waiting": lambda s, now: len(s.queues.waiting),
    "max_prefill_bs": lambda s, now: max(s.prefill_sizes, default=0),
    "ctx_requests": lambda s, now: _ctx_requests(s),
    "gen_requests": lambda s, now: len(s.queues.running) - s.num_resident_chunks,
    "backlog_requests": lambda s, now: len(s.queues.waiting) + s.num_resident_chunks,
    "backlog_rounds": lambda s, now: _backlog_rounds(s),
    "backlog_tokens": lambda s, now: _backlog_tokens(s),
    "head_wait_rounds": lambda s, now: _head_wait_rounds(s),
    "admissible": lambda s, now: int(s.can_admit),  # the queue head could be admitted now
    "pending_permille": lambda s, now: _pending_permille(s),
    "head_tokens": lambda s, now: _head_tokens(s),
    "spec_accepted": lambda s, now: _spec_accepted(s),
    # Wall or simulated clock in ms: policies use the max over ranks, so they agree.
    "now_ms": lambda s, now: int(now * 1000),
}


def column_reader(names: Sequence[str]) -> Callable[[Scheduler, float], tuple[int, ...]]:
    """A function returning ``names``' values for a scheduler at time ``now`` (seconds)."""
    unknown = [n for n in names if n not in READERS]
    if unknown:
        raise ValueError(f"unknown gather columns {unknown} (known: {sorted(READERS)})")
    readers = tuple(READERS[n] for n in names)

    def read(scheduler: Scheduler, now: float) -> tuple[int, ...]:
        return tuple(r(scheduler, now) for r in readers)

    return read
