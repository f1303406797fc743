"""Steady decode rounds, advanced in one step: the simulator's fast path.

Between events (an arrival, a finish, a policy opening for a held prompt) a group often runs
many rounds in which every rank only decodes the same requests: the rows are the same round
after round, the plans differ only by one token per request, and the policy's vote stays
closed for the prompts it holds. Running the full control plane for each of those rounds
costs ~10 us per rank; this module applies k of them at once with the same arithmetic, so
the result is the same to the last bit (``tests/test_fast_forward.py`` compares whole runs).

It only engages where that equivalence is easy to see:

- policies whose votes and updates read the gate's five columns only (the gate, ``none``
  and the local interval: no extra columns that would change from round to round);
- every rank: no resident chunk, no retracted request, no pending abort, and every running
  request decoding; held prompts are allowed while every vote keeps them held;
- the KV pool grants every page those rounds will need, and no probe flips (a held prompt's
  ``wants_prefill`` depends on the pool staying on the same side of the watermark);
- no request finishes and no arrival becomes due inside the skipped rounds; no timeline.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

from actors.control.page_keys import extend_keys
from actors.control.planner import PREFILL_WATERMARK
from actors.control.rank_loop import RankLoop
from actors.control.scheduler import Scheduler
from deployment.sim.cost_executor import SIM_TOKEN
from deployment.sim.round_costs import RoundCosts
from gate import RankRow, read_rows
from gate.group_gate import GroupGate
from gate.local_interval import LocalIntervalPolicy
from gate.no_gate import NoGate

if TYPE_CHECKING:
    from deployment.sim.simulator import RequestRecord

# Policies whose state after k identical rounds is what k calls of vote/observe give, and
# which read no column that changes while the group decodes.
STEADY_POLICIES = (GroupGate, NoGate, LocalIntervalPolicy)
# Below this many rounds the checks cost more than the rounds they save.
MIN_ROUNDS = 3


def supported(loops: Sequence[RankLoop]) -> bool:
    return all(type(loop.policy) in STEADY_POLICIES for loop in loops)


def steady_rounds(loops: Sequence[RankLoop], limit: int) -> int:
    """How many of the next rounds are steady on every rank (0 when not worth it)."""
    k = limit
    for loop in loops:
        s = loop.scheduler
        if s.retracted or s._partial or s._pending_aborts or s._aborted_events:
            return 0
        # The plan never cuts decodes short (a mixed engine reserves up to half the budget
        # for prefill while a vote may be open).
        if len(s.running) > s.args.max_scheduled_tokens // 2:
            return 0
        for req in s.running:
            if req.num_computed_tokens < req.num_prompt_tokens:
                return 0
            # No finish inside: the last skipped round must leave every request unfinished.
            left = req.sampling.max_tokens - len(req.output_token_ids)
            left = min(left, s.max_sequence_len - req.num_prompt_tokens - len(req.output_token_ids))
            if left - 1 < k:
                k = left - 1
                if k < MIN_ROUNDS:
                    return 0
    return k if k >= MIN_ROUNDS else 0


def _reserve_pages(loops: Sequence[RankLoop], k: int) -> bool:
    """Grant each rank's decodes the pages of the next k rounds, if every probe stays put."""
    for loop in loops:
        s = loop.scheduler
        pool = s.pool
        need = 0
        for req in s.running:
            tokens = req.num_prompt_tokens + len(req.output_token_ids) + k - 1
            need += max(0, pool.pages_for(tokens) - len(req.page_ids))
        if need > pool.num_free_pages:
            return False
        if s.waiting:
            before = pool.occupancy > PREFILL_WATERMARK
            after = (pool.num_used_pages + need) / pool.num_pages > PREFILL_WATERMARK
            if before != after:
                return False
    for loop in loops:
        s = loop.scheduler
        for req in s.running:
            s.pool.grow(req.request_id, req.num_prompt_tokens + len(req.output_token_ids) + k - 1)
    return True


def _next_multiple(r: int, step: int) -> int:
    """Smallest j >= 1 with (r + j) % step == 0."""
    return step - r % step


def _held_rounds(loops: Sequence[RankLoop], new_rows: list[RankRow], k: int) -> int:
    """Rounds (up to k) before a vote lets a rank plan a prompt it holds.

    Round 0 votes on the rows gathered last round, the later rounds on ``new_rows``; each
    steady policy's state after round j follows from its rule in closed form.
    """
    holding = [
        i
        for i, loop in enumerate(loops)
        if loop.scheduler.waiting and new_rows[i].wants_prefill and loop.scheduler.can_admit
    ]
    if not holding:
        return k
    first = k
    for i in holding:
        loop = loops[i]
        policy = loop.policy
        if policy.vote(loop.last_rows).permission.allow_new:
            return 0
        if isinstance(policy, GroupGate):
            r = policy.rounds_since_prefill + 1  # round 0 observes a busy decode round
            delay = policy.delay
            j = _next_multiple(r - 1, delay.any_interval)  # an ANY point, someone wants
            blocked = any(row.has_decode_work and not row.wants_prefill for row in new_rows)
            if not blocked:
                j = min(j, _next_multiple(r - 1, delay.attempt_interval))
            first = min(first, j)
        elif isinstance(policy, LocalIntervalPolicy):
            first = min(first, policy.remaining)
        else:  # NoGate: always open
            return 0
    return first


def _observe_steady(policy: object, k: int) -> None:
    """The state of a steady policy after observing k busy decode-only rounds."""
    if isinstance(policy, GroupGate):
        policy.rounds_since_prefill += k
    elif isinstance(policy, LocalIntervalPolicy):
        policy.remaining = max(0, policy.remaining - k)


def _keep_computed(s: Scheduler, starts_of: dict[int, int], k: int) -> None:
    """Key the pages the skipped decodes completed, when and in the order the full rounds
    would have: a page filled in round j is keyed as its request asks for its next page, in
    round j + 1, in running order (``PrefixCache.keep_last_page``); with prefix caching the
    first copy of a content stays cached. A page filled in the last skipped round is keyed
    by the next full round, as it would be."""
    page_size = s.pool.page_size
    events = []
    for order, req in enumerate(s.running):
        c0 = starts_of[id(req)]
        # A page the round before the skip filled is keyed in skipped round 0 (j = -1 here).
        first = -1 if c0 and c0 % page_size == 0 else (-c0 - 1) % page_size
        for j in range(first, k - 1, page_size):
            events.append((j, order, req, (c0 + j + 1) // page_size - 1))
    events.sort(key=lambda e: (e[0], e[1]))
    for _, _, req, page in events:
        keys = extend_keys(req.page_keys, req.token_ids, (page + 1) * page_size, page_size)
        s.pool.register(req.page_ids[page], keys[page])


def _steady_rows(loops: Sequence[RankLoop]) -> list[RankRow] | None:
    """The rows every rank publishes while it only decodes (what ``begin`` would build)."""
    rows = []
    for loop in loops:
        s = loop.scheduler
        probe = s.probe()
        n = len(s.running)
        rows.append(RankRow(n, n, 0, probe.wants_prefill, probe.has_decode_work))
    return rows


def advance(
    loops: Sequence[RankLoop],
    costs: RoundCosts,
    k: int,
    clock: float,
    next_event_s: float,
    records: dict[str, RequestRecord],
    itl: array,
    starts: deque,
) -> tuple[int, float]:
    """Apply up to k steady rounds; returns (rounds applied, clock after them)."""
    rows = _steady_rows(loops)
    view = read_rows(rows)
    if not view.decode_only:
        return 0, clock
    # Round durations, as the executor and the group would price them, until the next event.
    per_kv = costs.decode_per_kv_token_ms
    bases = []
    for loop in loops:
        running = loop.scheduler.running
        kv = sum(r.num_computed_tokens for r in running) if per_kv else 0
        bases.append((len(running), kv))
    ends: list[float] = []
    t = clock
    round_ms = 0.0
    for j in range(k):
        if t >= next_event_s:
            break
        if per_kv or not j:
            rank_s = [costs.rank_ms(n, 0, kv + j * n) / 1000.0 if n else 0.0 for n, kv in bases]
            round_ms = costs.group_ms([c * 1000 for c in rank_s], False)
        t += round_ms / 1000.0
        ends.append(t)
    k = _held_rounds(loops, rows, len(ends)) if len(ends) >= MIN_ROUNDS else 0
    if k < MIN_ROUNDS or not _reserve_pages(loops, k):
        return 0, clock
    del ends[k:]
    # Tokens in the order the full rounds record them: round by round, rank by rank, each
    # rank's running requests in plan order. After round 0 every request's last token is the
    # previous round's end, so a round's samples are all one value.
    running = [req for loop in loops for req in loop.scheduler.running]
    recs = [records[req.request_id] for req in running]
    itl.extend(array("d", [(ends[0] - rec.last_token_s) * 1000.0 for rec in recs]))
    for prev, end in pairwise(ends):
        itl.extend(array("d", [(end - prev) * 1000.0]) * len(recs))
    tokens = [SIM_TOKEN] * k
    starts_of = {id(req): req.num_computed_tokens for req in running}
    for rec, req in zip(recs, running, strict=True):
        rec.last_token_s = ends[-1]
        rec.num_output += k
        req.output_token_ids.extend(tokens)
        req.num_computed_tokens += k
    for loop, row in zip(loops, rows, strict=True):
        s = loop.scheduler
        if s.prefix.enabled:
            _keep_computed(s, starts_of, k)
        if row.wants_prefill:
            s.waits.wanted(s.round + 1)  # round 0 publishes a held prompt's first want
        if s.waiting and (
            s.pool.occupancy > PREFILL_WATERMARK or len(s.running) >= s.max_batch_size
        ):
            s.waits.excused_rounds += k
        s.round += k
        _observe_steady(loop.policy, k)
        loop.last_rows = rows
    starts.extend(ends)
    return k, ends[-1]
