"""Steady decode rounds, advanced in one step: the simulator's fast path.

Between events (an arrival, a policy opening for a held prompt) a group often runs many
rounds in which every rank only decodes the same requests: the rows are the same round
after round, the plans differ only by one token per request, and the policy's vote stays
closed for the prompts it holds. Running the full control plane for each of those rounds
costs ~10 us per rank; this module applies k of them at once with the same arithmetic, so
the result is the same to the last bit (``tests/test_fast_forward.py`` compares whole runs).

It only engages where that equivalence is easy to see:

- policies that say what quiet rounds do to them in closed form (``PrefillPolicy.steady``:
  the gate, ``none`` and the local interval, whose votes change nothing and read no extra
  column that would change from round to round): each says in how many rounds its vote
  opens for a held prompt and takes the state k rounds leave (``quiet_rounds_until_open``,
  ``advance_quiet``);
- every rank: no resident chunk, no retracted request, no pending abort, and every running
  request decoding; held prompts are allowed while every vote keeps them held;
- the KV pool grants every page those rounds will need, and no probe flips (a held prompt's
  ``wants_prefill`` depends on the pool staying on the same side of the watermark);
- no request finishes before the last skipped round (the last may finish some: its rows and
  votes come before the update that finishes them); no arrival becomes due inside; no
  timeline.

Each rank's scheduler makes the k rounds' state changes itself, through its public interface
(``scheduler.steady``'s ``horizon`` and ``page_grants`` ask, ``skip_decode_rounds`` applies:
its round counter and admission waits move as k held rounds would move them); this module
decides how many rounds to skip, prices them and keeps the records.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

from roundgate.actors.control.rank_loop import RankLoop
from roundgate.actors.control.request import Request
from roundgate.actors.control.round import RoundPlan, RoundResult, TokenEvent
from roundgate.actors.control.steady_decodes import Grant
from roundgate.gate.permission import HOLD_ALL
from roundgate.gate.rows import RankRow, RoundView, read_rows
from roundgate.sim.cost_executor import SIM_TOKEN
from roundgate.sim.round_costs import RoundCosts

if TYPE_CHECKING:
    from roundgate.sim.records import RequestRecord

# A decoding rank's row, by (batch size, wants_prefill, has_decode_work): rows are immutable
# and repeat call after call, and building one costs more than the lookup.
_ROWS: dict[tuple[int, bool, bool], RankRow] = {}
# A held rank's row in a full round, by (tokens, batch size, extends, has_decode_work).
_HELD_ROWS: dict[tuple[int, int, int, bool], RankRow] = {}


def supported(loops: Sequence[RankLoop]) -> bool:
    """Whether every rank's policy answers for quiet rounds in closed form."""
    return all(loop.policy.steady for loop in loops)


def _scan(loops: Sequence[RankLoop]) -> tuple[list[RankRow], list[int], list[int]] | None:
    """The rows every rank publishes while it decodes steadily, and for each rank the
    rounds until its first finish (the round that finishes counted) and until its first
    page grant (``SteadyDecodes.horizon``); None when some rank is not steady."""
    rows = []
    lefts = []
    grants = []
    for loop in loops:
        s = loop.scheduler
        if not s.is_steady:
            return None
        n = len(s.queues.running)
        # The plan never cuts decodes short (a mixed engine reserves up to half the budget
        # for prefill while a vote may be open).
        if n > s.config.max_scheduled_tokens // 2:
            return None
        first_end, first_grant = s.steady.horizon()
        probe = s.probe()
        key = (n, probe.wants_prefill, probe.has_decode_work)
        row = _ROWS.get(key)
        if row is None:
            row = _ROWS[key] = RankRow(n, n, 0, *key[1:])
        rows.append(row)
        lefts.append(first_end)
        grants.append(first_grant)
    return rows, lefts, grants


def _round_ends(
    loops: Sequence[RankLoop], costs: RoundCosts, k: int, clock: float, next_event_s: float
) -> list[float]:
    """End times of up to k rounds that start before the next event, priced as the executor
    and the group price them (the same float operations, so the same clock)."""
    ends: list[float] = []
    t = clock
    if not costs.decode_per_kv_token_ms:
        # Every round costs the same, and the slowest rank is the one with the most decodes:
        # a rank's price (and its ms -> s -> ms round trip) never falls as decodes grow.
        n = max(len(loop.scheduler.queues.running) for loop in loops)
        step = costs.group_ms([costs.rank_ms(n, 0, 0) / 1000.0 * 1000], False) / 1000.0
        for _ in range(k):
            if t >= next_event_s:
                break
            t += step
            ends.append(t)
        return ends
    bases = []
    for loop in loops:
        running = loop.scheduler.queues.running
        bases.append((len(running), sum(r.num_computed_tokens for r in running)))
    for j in range(k):
        if t >= next_event_s:
            break
        rank_s = [costs.rank_ms(n, 0, kv + j * n) / 1000.0 if n else 0.0 for n, kv in bases]
        t += costs.group_ms([c * 1000 for c in rank_s], False) / 1000.0
        ends.append(t)
    return ends


def _page_needs(
    loops: Sequence[RankLoop], k: int, first_grants: list[int]
) -> list[list[Grant]] | None:
    """Each rank's page grants over k rounds (``SteadyDecodes.page_grants``); None if a
    pool runs short or a held prompt's probe flips."""
    needs = []
    for loop, first_grant in zip(loops, first_grants, strict=True):
        grants = [] if first_grant >= k else loop.scheduler.steady.page_grants(k)
        if grants is None:
            return None
        needs.append(grants)
    return needs


def _held_rounds(loops: Sequence[RankLoop], new_rows: list[RankRow], k: int) -> int:
    """Rounds (up to k) before a vote lets a rank plan a prompt it holds.

    Round 0 votes on the rows gathered last round, the later rounds on ``new_rows``; each
    policy says when its vote opens (``PrefillPolicy.quiet_rounds_until_open``).
    """
    first = k
    for i, loop in enumerate(loops):
        s = loop.scheduler
        if not (s.queues.waiting and new_rows[i].wants_prefill and s.can_admit):
            continue
        policy = loop.policy
        if policy.vote(loop.last_rows).permission.allow_new:
            return 0
        j = policy.quiet_rounds_until_open(new_rows)
        if j is None:  # no closed form: no round is skipped
            return 0
        first = min(first, j)
    return first


def advance(
    loops: Sequence[RankLoop],
    costs: RoundCosts,
    limit: int,
    clock: float,
    next_event_s: float,
    records: dict[str, RequestRecord],
    itl: array,
    starts: deque,
    itl_slo_ms: float = float("inf"),
) -> tuple[int, float, list[Request]]:
    """Apply up to ``limit`` steady rounds, if the group is steady; returns (rounds applied,
    clock after them, the requests the last of them finished, in the full round's order).
    Each record counts its gaps above ``itl_slo_ms`` (``RequestRecord.slow_gaps``)."""
    for loop in loops:
        # A vote that admits a held prompt this very round (the common way a skip ends):
        # found before the scan, as ``_held_rounds`` would find it after.
        s = loop.scheduler
        if (
            s.queues.waiting
            and s.can_admit
            and loop.policy.vote(loop.last_rows).permission.allow_new
        ):
            return 0, clock, []
    scan = _scan(loops)
    if scan is None:
        return 0, clock, []
    rows, lefts, first_grants = scan
    if not any(row.batch_size for row in rows):
        return 0, clock, []  # an idle group (held prompts only): not a decode round
    ends = _round_ends(loops, costs, min(limit, *lefts), clock, next_event_s)
    k = _held_rounds(loops, rows, len(ends)) if ends else 0
    needs = _page_needs(loops, k, first_grants) if k else None
    if needs is None:
        return 0, clock, []
    del ends[k:]
    # Tokens in the order the full rounds record them: round by round, rank by rank, each
    # rank's running requests in plan order. After round 0 every request's last token is the
    # previous round's end, so a round's samples are all one value.
    first = ends[0]
    end_s = ends[-1]
    gaps = [(end - prev) * 1000.0 for prev, end in pairwise(ends)]
    # Rounds after the first give every request the same gap: count the slow ones once.
    slow_later = sum(1 for gap in gaps if gap > itl_slo_ms)
    samples = array("d")
    add = samples.append
    finished: list[Request] = []
    for loop, grants, left in zip(loops, needs, lefts, strict=True):
        s = loop.scheduler
        for req in s.queues.running:
            rec = records[req.request_id]
            gap = (first - rec.last_token_s) * 1000.0
            add(gap)
            if gap > itl_slo_ms:
                rec.slow_gaps += 1
            if slow_later:
                rec.slow_gaps += slow_later
            rec.last_token_s = end_s
            rec.num_output += k
        for req in s.skip_decode_rounds(k, grants, SIM_TOKEN, left):
            records[req.request_id].finish_s = end_s
            finished.append(req)
        loop.policy.advance_quiet(k)
        loop.last_rows = rows
    itl.extend(samples)
    for gap in gaps:
        itl.extend(array("d", [gap]) * len(samples))
    starts.extend(ends)
    return k, end_s, finished


def held_round(
    loops: Sequence[RankLoop],
) -> tuple[RoundView, list[float], list[list[TokenEvent]]]:
    """One full group round in which the ranks with no prefill work (nothing waiting, no
    resident chunk, nothing retracted or ending) skip their vote: it can only hold, and a
    steady policy's vote changes no state. They plan held, publish the row ``RankLoop.begin``
    would, and run the executor and ``update`` as ``RankLoop.finish`` would; the other ranks
    run ``begin``/``finish``. Returns the round's reading, each rank's forward seconds and its
    token events."""
    plans: list[RoundPlan | None] = []
    rows = []
    for loop in loops:
        s = loop.scheduler
        if s.queues.waiting or not s.is_steady:
            plans.append(None)
            rows.append(loop.begin())
            continue
        plan = s.plan(HOLD_ALL)
        plans.append(plan)
        batch_size, num_extends, _, num_tokens = plan.counts()
        key = (num_tokens, batch_size, num_extends, bool(s.queues.running))
        row = _HELD_ROWS.get(key)
        if row is None:
            row = _HELD_ROWS[key] = RankRow(num_tokens, batch_size, num_extends, False, key[3])
        rows.append(row)
    view = read_rows(rows)
    costs_s = []
    events = []
    for loop, plan in zip(loops, plans, strict=True):
        if plan is None:
            outcome = loop.finish(rows, view)
            costs_s.append(outcome.result.cost_s)
            events.append(outcome.events)
            continue
        loop.policy.observe(rows, view)
        loop.last_rows = rows
        result = RoundResult() if view.all_idle else loop.executor.execute(plan, rows, view)
        costs_s.append(result.cost_s)
        events.append(loop.scheduler.update(plan, result))
    return view, costs_s, events
