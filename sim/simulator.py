"""The group simulator: N ranks of the real control plane in one process, on a cost clock.

Each round runs every rank's real ``RankLoop`` (gate vote, scheduler plan, probe), gathers the
rows in-process, prices the round with ``RoundCosts`` (the slowest rank plus the extend-round
overhead) and advances a simulated clock. Nothing here models the gate separately: what the
simulator measures is the code the engine runs.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Sequence

from actors.control.request import Request, SamplingParams
from actors.server_args import ServerArgs
from gate import read_rows
from sim import decode_ranks, fast_forward, steady_policies
from sim.arrivals import Arrival, OpenLoop
from sim.cost_executor import cost_loops
from sim.kv_channel import KvChannel
from sim.prompts import FillerPrompts
from sim.records import (
    KIND_CODES,
    POINT_CODES,
    RequestRecord,
    SimResult,
    Timeline,
)
from sim.round_costs import RoundCosts
from sim.router import Router
from sim.sessions import arrival_source

# A round in which no rank runs a forward still costs the scheduler pass; keeps time moving.
IDLE_ROUND_MS = 0.01
FAST_MAX_ROUNDS = 4096  # at most this many rounds in one fast-forward step
INF = float("inf")


class GroupSimulator:
    """Runs one workload through ``dp_size`` ranks under one ``ServerArgs`` configuration.

    The policy is the one ``args`` select (``--prefill-policy``, or derived from the gate and
    local-interval flags); ``policy_name`` labels the result.
    """

    def __init__(
        self,
        args: ServerArgs,
        costs: RoundCosts,
        router: Router,
        policy_name: str = "roundgate",
        keep_timeline: bool = True,
        fast_forward: bool = True,
    ) -> None:
        self.args = args
        self.costs = costs
        self.router = router
        self.policy_name = policy_name
        self.keep_timeline = keep_timeline
        self.fast_forward = fast_forward
        self.clock = 0.0
        self.loops = cost_loops(args, costs, self._now)
        self._prompts = FillerPrompts(args.model_config.vocab_size)
        self._in_flight = [0] * args.dp_size
        self._pending: deque[tuple[float, int, int, Arrival]] = deque()
        # The kv routers' index is fed by the ranks' own KV events, through a lagging channel.
        self.channel = (
            None
            if router.kv is None
            else KvChannel(
                router.channel,
                [loop.scheduler for loop in self.loops],
                router.kv.index,
                seed=0,
                rounds_since_prefill=lambda r: getattr(
                    self.loops[r].policy, "rounds_since_prefill", None
                ),
            )
        )
        self._sources = [str(rank) for rank in range(args.dp_size)]

    def _now(self) -> float:
        return self.clock

    def _prompt(self, index: int, arrival: Arrival) -> list[int]:
        """The request's prompt tokens (``sim.prompts``)."""
        return self._prompts.make(index, arrival)

    def run(
        self,
        arrivals: Sequence[Arrival],
        max_rounds: int | None = None,
        on_round: Callable[[int, int], None] | None = None,
        concurrency: int | None = None,
    ) -> SimResult:
        """Simulate until every request finishes (or ``max_rounds``).

        ``concurrency`` N: N closed-loop clients (the arrivals' lengths, in order). A request
        reaches its scheduler ``schedule_lag_ms`` after it is sent, and is first planned
        ``plan_ahead_rounds`` round starts after that. The loop body is the hot path: hoist.
        """
        loops, costs, dp = self.loops, self.costs, self.args.dp_size
        schedulers = [loop.scheduler for loop in loops]
        begins = [loop.begin for loop in loops]
        finishes = [loop.finish for loop in loops]
        records: dict[str, RequestRecord] = {}
        itl = array("d")
        itl_append = itl.append
        timeline = Timeline() if self.keep_timeline else None
        group_ms = costs.group_ms
        clock = 0.0
        lag_s = costs.schedule_lag_ms / 1000.0
        source = arrival_source(arrivals, concurrency)
        closed = not isinstance(source, OpenLoop)
        # Sent and routed, not yet handed to the rank's scheduler: (visible_s, rank, index,
        # arrival), in send order (the lag is one constant, so also in visible order).
        pending: deque[tuple[float, int, int, Arrival]] = deque()
        self._pending = pending
        # Start times of the last rounds: a round plans what was visible when the round
        # ``plan_ahead`` starts earlier began (async scheduling), else at its own start.
        plan_ahead = int(costs.plan_ahead_rounds)
        starts = deque([0.0] * (plan_ahead + 1), maxlen=plan_ahead + 1)
        next_send = source.next_send_s
        # Steady decode rounds in one step (sim/fast_forward.py), where exact.
        fast = self.fast_forward and timeline is None and steady_policies.supported(loops)
        # Collections: each rank's requests until its next one; the ranks due collect in
        # the group's next busy round (sim/round_costs.py).
        gc_period = costs.gc_period()
        gc_left = costs.gc_first(dp) if gc_period else []
        gc_due: list[int] = []
        collections = 0
        # Where the ITL samples fall in time (the steady-state window reads them): the clock
        # after each step and how many samples existed then.
        step_end_s = array("d")
        step_itl = array("q")
        rounds = busy = prefill_rounds = decode_rounds = 0
        finished = 0
        in_flight = self._in_flight = [0] * dp  # routed, not yet admitted, per rank
        channel = self.channel
        while True:
            admit_until = starts[0]
            while True:
                # Sends and admissions interleave in time order, so a router reading the
                # ranks' queues sees every request admitted before it was sent.
                while pending and pending[0][0] <= admit_until:
                    _, rank, index, arrival = pending.popleft()
                    in_flight[rank] -= 1
                    self._admit(arrival, rank, index, records)
                if next_send > clock:
                    break
                index, arrival = source.pop()
                rank = self._route(arrival, index, arrival.time_s)
                in_flight[rank] += 1
                pending.append((arrival.time_s + lag_s, rank, index, arrival))
                next_send = source.next_send_s
            if not any(s.has_unfinished for s in schedulers):
                next_time = min(next_send, pending[0][0] if pending else INF)
                if next_time == INF:
                    break
                # A live group would step idle rounds until the next arrival; one idle
                # observation leaves each policy in the state those rounds would. An idle
                # engine plans the moment a request arrives: nothing is in flight.
                for loop in loops:
                    loop.observe_idle()
                clock = self.clock = max(clock, next_time)
                starts.extend([clock] * (plan_ahead + 1))
                continue
            if max_rounds is not None and rounds >= max_rounds:
                break
            left = (
                FAST_MAX_ROUNDS if max_rounds is None else min(max_rounds - rounds, FAST_MAX_ROUNDS)
            )
            if gc_due:  # a collecting round is priced one by one
                left = 0
            if fast and not pending and left:
                k, clock, done = fast_forward.advance(
                    loops, costs, left, clock, next_send, records, itl, starts
                )
                if k:
                    self.clock = clock
                    rounds, busy, decode_rounds = rounds + k, busy + k, decode_rounds + k
                    if channel is not None:
                        channel.tick(rounds, clock)
                    finished += len(done)
                    if gc_period:
                        for request in done:
                            rank = records[request.request_id].rank
                            gc_left[rank] -= 1
                            if gc_left[rank] == 0:
                                gc_due.append(rank)
                                gc_left[rank] = gc_period
                    if closed:
                        for request in done:
                            source.finished(clock, request)
                            next_send = source.next_send_s
                    step_end_s.append(clock)
                    step_itl.append(len(itl))
                    if on_round is not None:
                        on_round(rounds, finished)
                    continue
            # The collectors' batches as the round begins: the requests their heaps hold.
            gc_ms = sum(costs.gc_pause_ms(len(schedulers[r].running)) for r in gc_due)
            if fast:
                # The ranks with no prefill work decode without plan objects, exactly.
                view, costs_s, events = decode_ranks.step(loops, costs)
                outcomes = None
            else:
                rows = [begin() for begin in begins]
                view = read_rows(rows)  # one reading for every rank of the round
                outcomes = [finish(rows, view) for finish in finishes]
                costs_s = [o.result.cost_s for o in outcomes]
                events = [o.events for o in outcomes]
            any_extend = view.any_extend
            if not view.all_idle:
                round_ms = group_ms([c * 1000 for c in costs_s], any_extend)
                if gc_due:
                    round_ms += gc_ms
                    collections += len(gc_due)
                    gc_due.clear()
                busy += 1
                if any_extend:
                    prefill_rounds += 1
                else:
                    decode_rounds += 1
            else:
                round_ms = IDLE_ROUND_MS
            start = clock
            clock += round_ms / 1000.0
            self.clock = clock
            starts.append(clock)
            rounds += 1
            if channel is not None:
                channel.tick(rounds, clock)
            for rank, rank_events in enumerate(events):
                for request, token_id, done in rank_events:
                    rec = records[request.request_id]
                    if token_id is not None:
                        if rec.first_token_s is None:
                            rec.first_token_s = clock
                            rec.admission_wait = schedulers[rank].admission_wait(request)
                        else:
                            itl_append((clock - rec.last_token_s) * 1000.0)
                        rec.last_token_s = clock
                        rec.num_output += 1
                    if done:
                        rec.finish_s = clock
                        finished += 1
                        if gc_period:
                            gc_left[rank] -= 1
                            if gc_left[rank] == 0:
                                gc_due.append(rank)
                                gc_left[rank] = gc_period
                        if closed:
                            source.finished(clock, request)
                            next_send = source.next_send_s
            step_end_s.append(clock)
            step_itl.append(len(itl))
            if timeline is not None and outcomes is not None:
                timeline.start_s.append(start)
                timeline.duration_ms.append(round_ms)
                timeline.kinds.extend(KIND_CODES[o.plan.kind] for o in outcomes)
                vote = outcomes[0].vote
                timeline.points.append(POINT_CODES[vote.point])
                timeline.opened.append(vote.open)
            if on_round is not None:
                on_round(rounds, finished)
        return SimResult(
            policy=self.policy_name,
            dp_size=dp,
            duration_s=clock,
            rounds=rounds,
            busy_rounds=busy,
            prefill_rounds=prefill_rounds,
            decode_rounds=decode_rounds,
            records=list(records.values()),
            itl_ms=itl,
            timeline=timeline,
            unfinished=len(records) - finished,
            prefix_queries=sum(s.prefix.num_queries for s in schedulers),
            prefix_hits=sum(s.prefix.num_hits for s in schedulers),
            collections=collections,
            step_end_s=step_end_s,
            step_itl_count=step_itl,
        )

    def _route(self, arrival: Arrival, index: int, now_s: float) -> int:
        """The rank a request goes to when it is sent (a trace may pin it)."""
        if arrival.rank is not None:
            rank = arrival.rank
            if not 0 <= rank < self.args.dp_size:
                raise ValueError(f"trace pins request {index} to rank {rank}, outside dp_size")
            return rank
        schedulers = [loop.scheduler for loop in self.loops]
        if self.router.policy == "vllm-lb":
            # What the engines report: their queues, plus requests that reached the engine
            # but wait for the next plan (async scheduling).
            waiting = [len(s.waiting) for s in schedulers]
            for visible_s, rank, _, _ in self._pending:
                if visible_s <= now_s:
                    waiting[rank] += 1
            running = [len(s.running) for s in schedulers]
            return self.router.route_stale(now_s, waiting, running)
        # The router knows what it sent: a rank's load counts its requests still in flight.
        in_flight = self._in_flight
        loads = [len(s.requests) + in_flight[r] for r, s in enumerate(schedulers)]
        session = None if arrival.session is None else str(arrival.session.session_id)
        if self.router.kv is not None:
            match = self.router.matcher(schedulers)
            choice = self.router.kv.choose(
                self._sources, loads, self._prompt(index, arrival), now_s, session, match
            )
            return int(choice.rank)
        if self.router.policy == "cache-aware":
            return self.router.route(loads, self._prompt(index, arrival), session)
        return self.router.route(loads)

    def _admit(
        self, arrival: Arrival, rank: int, index: int, records: dict[str, RequestRecord]
    ) -> None:
        request_id = f"req-{index}"
        sampling = SamplingParams(max_tokens=arrival.output_tokens)
        request = Request(request_id, self._prompt(index, arrival), sampling)
        self.loops[rank].scheduler.add_request(request)
        records[request_id] = RequestRecord(
            rank, arrival.time_s, arrival.prompt_tokens, turn=arrival.turn
        )
