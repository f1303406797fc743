"""The group simulator: N ranks of the real control plane in one process, on a cost clock.

Each round runs every rank's real ``RankLoop`` (gate vote, scheduler plan, probe), gathers the
rows in-process, prices the round with ``RoundCosts`` (the slowest rank plus the extend-round
overhead) and advances a simulated clock. Nothing here models the gate separately: what the
simulator measures is the code the engine runs. Sends, admissions, records, closed-loop
clients and collections are the event loop's (``roundgate.sim.loop``); this module is the fused
group's step: its rounds, its fast path, and where its requests go.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from roundgate.actors.control.request import Request
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.rows import read_rows
from roundgate.sim import fast_forward
from roundgate.sim.arrivals import INF, Arrival
from roundgate.sim.cost_executor import cost_loops
from roundgate.sim.expert_parallel import ExpertBalancer, ExpertSpec
from roundgate.sim.kv_channel import KvChannel
from roundgate.sim.loop import IDLE_ROUND_MS, Collector, SimLoop
from roundgate.sim.prompts import FillerPrompts
from roundgate.sim.records import KIND_CODES, POINT_CODES, SimResult, Timeline
from roundgate.sim.round_costs import RoundCosts
from roundgate.sim.router import Router
from roundgate.sim.sessions import arrival_source
from roundgate.sim.speculation import SpecSim

FAST_MAX_ROUNDS = 4096  # at most this many rounds in one fast-forward step


class GroupSimulator:
    """Runs one workload through ``dp_size`` ranks under one ``ServerArgs`` configuration.

    The policy is the one ``args`` select (``--prefill-policy``, or derived from the gate and
    local-interval flags); ``policy_name`` labels the result. The simulator is the fused
    group's ``roundgate.sim.loop.GroupStep``: the loop calls it back for its rounds.
    """

    def __init__(
        self,
        args: ServerArgs,
        costs: RoundCosts,
        router: Router,
        policy_name: str = "roundgate",
        keep_timeline: bool = True,
        fast_forward: bool = True,
        experts: ExpertSpec | None = None,
        speculation: SpecSim | None = None,
        seed: int = 0,
    ) -> None:
        self.args = args
        # Drafts on every decode, kept at a rate (sim/speculation.py); None: none.
        self.speculation = speculation
        # The MoE layers' expert load (None: every rank at the mean load, the preset's price).
        self.experts = experts
        self.costs = costs
        self.router = router
        self.policy_name = policy_name
        self.keep_timeline = keep_timeline
        self.fast_forward = fast_forward
        self.clock = 0.0
        self.loops = cost_loops(args, costs, self._now, speculation, seed)
        self.schedulers = [loop.scheduler for loop in self.loops]
        self._begins = [loop.begin for loop in self.loops]
        self._finishes = [loop.finish for loop in self.loops]
        self._prompts = FillerPrompts(args.model_config.vocab_size)
        # The kv routers' index is fed by the ranks' own KV events, through a lagging channel.
        self.channel = (
            None
            if router.kv is None
            else KvChannel(
                router.channel,
                self.schedulers,
                router.kv.index,
                seed=0,
                rounds_since_prefill=lambda r: self.loops[r].policy.rounds_since_prefill,
            )
        )
        self._sources = [str(rank) for rank in range(args.dp_size)]
        self._reset()

    def _now(self) -> float:
        return self.clock

    def _reset(self) -> None:
        """A run's own state: its timeline, plan-ahead window, collector and counters."""
        costs = self.costs
        self.timeline = Timeline() if self.keep_timeline else None
        # Start times of the last rounds: a round plans what was visible when the round
        # ``plan_ahead`` starts earlier began (async scheduling), else at its own start.
        self._plan_ahead = plan_ahead = int(costs.plan_ahead_rounds)
        self._starts = deque([0.0] * (plan_ahead + 1), maxlen=plan_ahead + 1)
        # Steady decode rounds in one step (sim/fast_forward.py), where exact: not with an
        # expert load, whose drift makes every round's price its own.
        self._balancer = None if self.experts is None else ExpertBalancer(self.experts)
        self._fast = (
            self.fast_forward
            and self.timeline is None
            and self._balancer is None
            and self.speculation is None  # a verification's yield is drawn round by round
            and fast_forward.supported(self.loops)
        )
        # Collections: each rank's requests until its next one (sim/round_costs.py).
        self._collector = Collector.of(costs, self.args.dp_size)
        self.busy_rounds = self.prefill_rounds = self.decode_rounds = 0
        self._itl_slo_ms = INF

    def run(
        self,
        arrivals: Sequence[Arrival],
        max_rounds: int | None = None,
        on_round: Callable[[int, int], None] | None = None,
        concurrency: int | None = None,
        itl_slo_ms: float = INF,
    ) -> SimResult:
        """Simulate until every request finishes (or ``max_rounds``).

        ``concurrency`` N: N closed-loop clients (the arrivals' lengths, in order). A request
        reaches its scheduler ``schedule_lag_ms`` after it is sent, and is first planned
        ``plan_ahead_rounds`` round starts after that. Each record counts its inter-token
        gaps above ``itl_slo_ms`` (goodput, ``roundgate.sim.goodput``).
        """
        self._reset()
        self._itl_slo_ms = itl_slo_ms
        self.clock = 0.0
        loop = SimLoop(
            arrival_source(arrivals, concurrency),
            self._prompts,
            self.costs.schedule_lag_ms / 1000.0,
            self.args.dp_size,
            step_times=True,
            max_rounds=max_rounds,
            on_round=on_round,
            itl_slo_ms=itl_slo_ms,
        )
        loop.run([self])
        schedulers = self.schedulers
        collector = self._collector
        return loop.result(
            policy=self.policy_name,
            dp_size=self.args.dp_size,
            duration_s=self.clock,
            busy_rounds=self.busy_rounds,
            prefill_rounds=self.prefill_rounds,
            decode_rounds=self.decode_rounds,
            timeline=self.timeline,
            prefix_queries=sum(s.prefix.num_queries for s in schedulers),
            prefix_hits=sum(s.prefix.num_hits for s in schedulers),
            collections=0 if collector is None else collector.count,
            experts=None if self._balancer is None else self._balancer.stats(),
        )

    # ---- the loop's calls (``roundgate.sim.loop.GroupStep``)
    # ------------------------------------------

    def next_time(self, loop: SimLoop) -> float:
        """A fused group acts at its clock: its idle jumps are its own (``idle``)."""
        return self.clock

    def begin(self, loop: SimLoop, at: float) -> None:
        loop.intake(self.clock, self._starts[0])

    def idle(self, loop: SimLoop) -> bool:
        """Nothing to plan: jump to the next send or admission, if any."""
        sent = loop.sent
        next_time = min(loop.next_send, sent[0][0] if sent else INF)
        if next_time == INF:
            return False
        # A live group would step idle rounds until the next arrival; one idle observation
        # leaves each policy in the state those rounds would. An idle engine plans the
        # moment a request arrives: nothing is in flight.
        for rank_loop in self.loops:
            rank_loop.observe_idle()
        self.clock = max(self.clock, next_time)
        self._starts.extend([self.clock] * (self._plan_ahead + 1))
        return True

    def step(self, loop: SimLoop) -> int:
        """Steady decode rounds in one step where exact (none while a request is on its way
        or a collection is due: those rounds are priced one by one), else one round."""
        if self._fast and not loop.sent:
            max_rounds = loop.max_rounds
            left = (
                FAST_MAX_ROUNDS
                if max_rounds is None
                else min(max_rounds - loop.rounds, FAST_MAX_ROUNDS)
            )
            collector = self._collector
            if left and (collector is None or not collector.due):
                k = self._skip(loop, left)
                if k:
                    return k
        return self._round(loop)

    def route(self, loop: SimLoop, arrival: Arrival, index: int) -> int:
        """The rank a request goes to when it is sent (a trace may pin it)."""
        now_s = arrival.time_s
        if arrival.rank is not None:
            rank = arrival.rank
            if not 0 <= rank < self.args.dp_size:
                raise ValueError(f"trace pins request {index} to rank {rank}, outside dp_size")
            return rank
        if self.router.policy == "vllm-lb":
            # What the engines report: their queues, plus requests that reached the engine
            # but wait for the next plan (async scheduling).
            schedulers = self.schedulers
            waiting = [len(s.queues.waiting) for s in schedulers]
            for visible_s, rank, _, _ in loop.sent:
                if visible_s <= now_s:
                    waiting[rank] += 1
            running = [len(s.queues.running) for s in schedulers]
            return self.router.route_stale(now_s, waiting, running)
        return loop.choose(self.router, self.schedulers, self._sources, arrival, index, now_s)

    def admit(self, rank: int, request: Request) -> None:
        self.schedulers[rank].add_request(request)

    # ---- rounds -----------------------------------------------------------------------------

    def _skip(self, loop: SimLoop, left: int) -> int:
        """Up to ``left`` steady rounds in one step (``roundgate.sim.fast_forward``); the rounds
        run."""
        k, clock, done = fast_forward.advance(
            self.loops,
            self.costs,
            left,
            self.clock,
            loop.next_send,
            loop.records,
            loop.itl,
            self._starts,
            self._itl_slo_ms,
        )
        if k:
            self.clock = clock
            self.busy_rounds += k
            self.decode_rounds += k
            if self.channel is not None:
                self.channel.tick(loop.rounds + k, clock)
            records = loop.records
            for request in done:
                loop.finish(request, records[request.request_id].rank, clock, self._collector)
        return k

    def _round(self, loop: SimLoop) -> int:
        """One group round: every rank's vote, plan and forward, priced; its tokens recorded."""
        costs, schedulers, collector = self.costs, self.schedulers, self._collector
        collecting = collector is not None and collector.due
        # The collectors' batches as the round begins: the requests their heaps hold.
        gc_ms = collector.pause_ms(schedulers) if collecting else 0.0
        if self._fast:
            # The ranks with no prefill work plan held without a vote, exactly.
            view, costs_s, events = fast_forward.held_round(self.loops)
            outcomes = None
        else:
            rows = [begin() for begin in self._begins]
            view = read_rows(rows)  # one reading for every rank of the round
            outcomes = [finish(rows, view) for finish in self._finishes]
            costs_s = [o.result.cost_s for o in outcomes]
            events = [o.events for o in outcomes]
        any_extend = view.any_extend
        if not view.all_idle:
            forwards_ms = [c * 1000 for c in costs_s]
            round_ms = costs.group_ms(forwards_ms, any_extend)
            balancer = self._balancer
            if balancer is not None and outcomes is not None:
                tokens = sum(o.plan.counts()[3] for o in outcomes)
                round_ms += balancer.extra_ms(max(forwards_ms), tokens)
            if collecting:
                round_ms += gc_ms
                collector.collect()
            self.busy_rounds += 1
            if any_extend:
                self.prefill_rounds += 1
            else:
                self.decode_rounds += 1
        else:
            round_ms = IDLE_ROUND_MS
        start = self.clock
        clock = self.clock = start + round_ms / 1000.0
        self._starts.append(clock)
        if self.channel is not None:
            self.channel.tick(loop.rounds + 1, clock)
        loop.record(events, clock, schedulers, collector)
        timeline = self.timeline
        if timeline is not None and outcomes is not None:
            timeline.start_s.append(start)
            timeline.duration_ms.append(round_ms)
            timeline.kinds.extend(KIND_CODES[o.plan.kind] for o in outcomes)
            timeline.prefill_tokens.extend(o.plan.num_prefill_tokens for o in outcomes)
            vote = outcomes[0].vote
            timeline.points.append(POINT_CODES[vote.point])
            timeline.opened.append(vote.open)
        return 1
