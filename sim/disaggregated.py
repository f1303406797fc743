"""P/D in the simulator: a prefill group and a decode group of the real control plane.

Each group is a ``RankLoop`` per rank over the role's scheduler (``--disaggregation-mode
prefill`` / ``decode``, ``roundgate.actors.control.prefill_role`` and ``decode_role``), with its own
round clock: a group round costs its slowest rank (``RoundCosts.group_ms``; the decode group
never extends, so it never pays ``extend_overhead_ms``). The two groups run side by side in
the fused runs' event loop (``roundgate.sim.loop``), which always steps the one whose clock is
behind, so what one group hands the other is seen no earlier than it was sent; each group is a
``GroupStep`` that acts at its clock while it has work, else at its next inbound event.

    arrival ─► router ─► prefill rank ── Handoff at its round's end ──► least-loaded decode rank
                                        (pages pinned)                  waits, then reserves
    transfer: starts when the decode plan reserved (both ends' links free), lasts
    RoundCosts.transfer_ms; at its end the prefill rank releases and the decode rank decodes.

The prefill router is the fused runs' (``--router``) over the prefill ranks. Under the kv
routers (``kv-aware``, ``oracle``) both choices read the ranks' own KV events, as the served
P/D does under ``router: kv-aware``: each group's pools publish through a ``KvChannel`` (the
run's lag and loss); the prefill rank is kv-aware's least cost (uncached prompt tokens, then
backlog), the decode rank the least reported decode load (``roundgate.routing.decode_load``).
Under the other routers a handoff goes to the decode rank with the fewest requests (held,
waiting or on their way). ``gate-aware`` is refused: neither group runs the gate.

A request's first token reaches its client from the decode rank, in the round its KV arrived
(as the served path streams it), so TTFT counts the transfer and the wait for decode capacity.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Any

from roundgate.actors import pd_roles
from roundgate.actors.control.handoff import Handoff, HandoffReleased, KVArrived, TransferEnd
from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.control.request import Request
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.rows import read_rows
from roundgate.routing import registry
from roundgate.routing.decode_load import DecodeLoadPolicy
from roundgate.routing.spec import flag
from roundgate.sim.arrivals import INF, Arrival
from roundgate.sim.cost_executor import cost_loops
from roundgate.sim.kv_channel import KvChannel
from roundgate.sim.loop import IDLE_ROUND_MS, SimLoop
from roundgate.sim.prompts import FillerPrompts
from roundgate.sim.records import SimResult
from roundgate.sim.round_costs import RoundCosts
from roundgate.sim.router import Router
from roundgate.sim.sessions import arrival_source


class _Group:
    """One role's ranks and their clock: a ``roundgate.sim.loop.GroupStep`` that acts at its clock
    while it has work, else at its next inbound event."""

    def __init__(self, args: ServerArgs, costs: RoundCosts, now: list[float]) -> None:
        self.args = args
        self.costs = costs
        self.now = now  # the clock the policies' ``now_ms`` column reads (both groups')
        self.loops = cost_loops(args, costs, lambda: now[0])
        self.schedulers = [loop.scheduler for loop in self.loops]
        self.clock = 0.0
        self.stalled = False  # its last round was idle: it waits for an event
        self.rounds = self.busy_rounds = 0
        self.num_extends = 0  # prefill chunks run (a decode group's stays 0)
        self.channel: KvChannel | None = None  # where its pools' KV events go (kv routers)

    @property
    def has_work(self) -> bool:
        return not self.stalled and any(s.has_unfinished for s in self.schedulers)

    def _move_to(self, at: float) -> None:
        self.clock = max(self.clock, at)
        self.now[0] = self.clock

    def idle(self, loop: SimLoop) -> bool:
        """No unfinished work: the group waits for its next event (``next_time``)."""
        return True

    def _round(self) -> tuple[float, list[RoundOutcome]]:
        """One group round; returns its start and every rank's outcome (the round's KV
        events then go out on the group's channel)."""
        rows = [loop.begin() for loop in self.loops]
        view = read_rows(rows)
        outcomes = [loop.finish(rows, view) for loop in self.loops]
        start = self.clock
        self.rounds += 1
        self.num_extends += sum(o.plan.num_extends for o in outcomes)
        if view.all_idle:
            self.stalled = True
            self.clock += IDLE_ROUND_MS / 1000.0
        else:
            self.busy_rounds += 1
            ms = self.costs.group_ms([o.result.cost_s * 1000 for o in outcomes], view.any_extend)
            self.clock += ms / 1000.0
        if self.channel is not None:
            self.channel.tick(self.rounds, self.clock)
        return start, outcomes

    def end_due(self, ends: list, message: Callable[[str], TransferEnd]) -> None:
        """Apply the transfer ends (``(time, rank, request id)`` heap) due by this group's
        clock, in time order: each rank's connector takes ``message(request id)``."""
        while ends and ends[0][0] <= self.clock:
            _, rank, rid = heapq.heappop(ends)
            self.schedulers[rank].connector.end_transfer(message(rid))
            self.stalled = False


class _Transfers:
    """What crosses between the groups: handoffs on their way to a decode rank, KV transfers
    on both ends' links, and the releases of the prefill ranks' pinned pages."""

    def __init__(self, prefill: ServerArgs, decode: ServerArgs, costs: RoundCosts) -> None:
        self.costs = costs
        self.page_size = decode.page_size
        self.handed: deque[tuple[float, int, Handoff]] = deque()  # (visible, decode rank, handoff)
        self.arrived: list[tuple[float, int, str]] = []  # heap: (time, decode rank, id)
        self.released: list[tuple[float, int, str]] = []  # heap: (time, prefill rank, id)
        self.p_link = [0.0] * prefill.dp_size  # when each rank's link is free
        self.d_link = [0.0] * decode.dp_size
        self.num_transfers = self.num_pages_moved = self.num_pages_cached = 0
        self.transfer_ms: list[float] = []  # per transfer: reserved -> arrived

    def start(self, outcome: RoundOutcome, rank: int, start: float) -> None:
        """The transfers decode rank ``rank`` reserved pages for in the round from ``start``:
        each begins when both ends' links are free and lasts ``RoundCosts.transfer_ms``."""
        for reservation in outcome.plan.reservations:
            source_rank = reservation.handoff.source_rank
            pages = len(reservation.page_indices)
            busy_ms, done_ms = self.costs.transfer_ms(pages, self.page_size)
            begin = max(start, self.p_link[source_rank], self.d_link[rank])
            self.p_link[source_rank] = self.d_link[rank] = begin + busy_ms / 1000.0
            done = begin + done_ms / 1000.0
            heapq.heappush(self.arrived, (done, rank, reservation.request_id))
            heapq.heappush(self.released, (done, source_rank, reservation.request_id))
            self.num_transfers += 1
            self.num_pages_moved += pages
            self.num_pages_cached += reservation.num_cached_pages
            self.transfer_ms.append((done - start) * 1000.0)


class _DecodeGroup(_Group):
    """The group handoffs enter: it reserves pages, waits for their KV, then decodes."""

    def __init__(
        self,
        args: ServerArgs,
        costs: RoundCosts,
        now: list[float],
        transfers: _Transfers,
        policy: DecodeLoadPolicy | None,
    ) -> None:
        super().__init__(args, costs, now)
        self.transfers = transfers
        self.policy = policy  # the kv routers' decode load (None: the fewest requests)
        self.routed = [0] * args.dp_size  # handoffs on their way to each rank
        self._sources = [str(r) for r in range(args.dp_size)]

    def hand_over(self, handoff: Handoff, now_s: float) -> None:
        """A prefill rank's handoff leaves for the decode rank chosen now: the least reported
        decode load (kv routers), else the fewest requests (held, waiting or on their way)."""
        loads = [len(s.queues.requests) + self.routed[r] for r, s in enumerate(self.schedulers)]
        if self.policy is None:
            rank = min(range(len(loads)), key=lambda r: (loads[r], r))
        else:
            choice = self.policy.choose(self._sources, loads, handoff.prompt_token_ids, now_s)
            rank = int(choice.rank)
        self.routed[rank] += 1
        self.transfers.handed.append((now_s, rank, handoff))

    def next_time(self, loop: SimLoop) -> float:
        if self.has_work:
            return self.clock
        return _first(INF, self.transfers.handed, self.transfers.arrived)

    def begin(self, loop: SimLoop, at: float) -> None:
        self._move_to(at)
        handed, arrived = self.transfers.handed, self.transfers.arrived
        while handed and handed[0][0] <= self.clock:
            _, rank, handoff = handed.popleft()
            self.routed[rank] -= 1
            self.schedulers[rank].connector.add_handoff(handoff)
            self.stalled = False
        self.end_due(arrived, KVArrived)

    def step(self, loop: SimLoop) -> int:
        start, outcomes = self._round()
        for rank, outcome in enumerate(outcomes):
            self.transfers.start(outcome, rank, start)
        loop.record([o.events for o in outcomes], self.clock)
        return 1


class _PrefillGroup(_Group):
    """The group requests enter: routed by the run's router, prefilled, handed over."""

    def __init__(
        self,
        args: ServerArgs,
        costs: RoundCosts,
        now: list[float],
        router: Router,
        decode: _DecodeGroup,
    ) -> None:
        super().__init__(args, costs, now)
        self.router = router
        self.decode = decode
        self.transfers = decode.transfers
        self._sources = [str(r) for r in range(args.dp_size)]
        for rank, scheduler in enumerate(self.schedulers):
            scheduler.connector.rank = rank

    def next_time(self, loop: SimLoop) -> float:
        if self.has_work:
            return self.clock
        return _first(loop.next_send, loop.sent, self.transfers.released)

    def begin(self, loop: SimLoop, at: float) -> None:
        """Sends first, then admissions (its router reads the queues as its last round left
        them), then the pages whose transfer ended."""
        self._move_to(at)
        loop.send_due(self.clock)
        loop.admit_due(self.clock)
        self.end_due(self.transfers.released, HandoffReleased)

    def step(self, loop: SimLoop) -> int:
        _, outcomes = self._round()
        for outcome in outcomes:
            for handoff in outcome.handoffs:
                self.decode.hand_over(handoff, self.clock)
        loop.record([o.events for o in outcomes], self.clock)
        return 1

    def route(self, loop: SimLoop, arrival: Arrival, index: int) -> int:
        """The prefill rank a request goes to (the fused runs' router, over the P group)."""
        if self.router.policy == "vllm-lb":
            waiting = [len(s.queues.waiting) for s in self.schedulers]
            return self.router.route_stale(self.clock, waiting, loop.loads(self.schedulers))
        return loop.choose(self.router, self.schedulers, self._sources, arrival, index, self.clock)

    def admit(self, rank: int, request: Request) -> None:
        self.schedulers[rank].add_request(request)
        self.stalled = False


class PDSimulator:
    """A prefill group and a decode group, with KV transfers priced by ``costs``.

    ``router`` spreads arrivals over the prefill ranks (the matrix's routers); each handoff
    goes to the decode rank with the least reported decode load under the kv routers, else
    with the fewest requests (held, waiting or on their way).
    """

    def __init__(
        self,
        prefill_args: ServerArgs,
        decode_args: ServerArgs,
        costs: RoundCosts,
        router: Router,
        label: str = "pd",
    ) -> None:
        pd_roles.check_pair(prefill_args, decode_args)
        registry.check_pd(router.policy, flag)
        self.costs = costs
        self.router = router
        self.label = label
        self.now = [0.0]  # the clock the policies' ``now_ms`` column reads
        # The kv routers: each group's pools publish to its router's index (the decode
        # role's on the same channel settings, with its own policy).
        kv = router.kv
        self.decode_policy = None if kv is None else DecodeLoadPolicy(kv.config)
        self.transfers = _Transfers(prefill_args, decode_args, costs)
        self.decode = _DecodeGroup(decode_args, costs, self.now, self.transfers, self.decode_policy)
        self.prefill = _PrefillGroup(prefill_args, costs, self.now, router, self.decode)
        self._prompts = FillerPrompts(prefill_args.model_config.vocab_size)
        if kv is not None:
            self.prefill.channel = KvChannel(router.channel, self.prefill.schedulers, kv.index)
            self.decode.channel = KvChannel(
                router.channel, self.decode.schedulers, self.decode_policy.index
            )

    @property
    def num_transfers(self) -> int:
        return self.transfers.num_transfers

    @property
    def num_pages_moved(self) -> int:
        return self.transfers.num_pages_moved

    @property
    def num_pages_cached(self) -> int:
        """Pages a decode rank already held (its prefix cache): reserved, not moved."""
        return self.transfers.num_pages_cached

    @property
    def transfer_ms(self) -> list[float]:
        """Per transfer: reserved -> arrived."""
        return self.transfers.transfer_ms

    def run(
        self,
        arrivals: list[Arrival] | tuple[Arrival, ...],
        concurrency: int | None = None,
        itl_slo_ms: float = float("inf"),
    ):
        """Simulate until every request finishes; a ``SimResult`` like a fused run's."""
        p, d = self.prefill, self.decode
        loop = SimLoop(
            arrival_source(arrivals, concurrency),
            self._prompts,
            self.costs.schedule_lag_ms / 1000.0,
            p.args.dp_size,
            itl_slo_ms=itl_slo_ms,
        )
        loop.run([p, d])
        return loop.result(
            policy=self.label,
            dp_size=p.args.dp_size + d.args.dp_size,
            duration_s=max(p.clock, d.clock),
            busy_rounds=p.busy_rounds + d.busy_rounds,
            prefill_rounds=p.busy_rounds,
            decode_rounds=d.busy_rounds,
            timeline=None,
            prefix_queries=sum(s.prefix.num_queries for s in p.schedulers),
            prefix_hits=sum(s.prefix.num_hits for s in p.schedulers),
        )


def _first(after: float, *queues) -> float:
    """The earliest of ``after`` and the queues' first times (a deque's head, a heap's top)."""
    times = [after] + [q[0][0] for q in queues if q]
    return min(times)


def parse_split(text: str) -> tuple[int, int]:
    """``--disaggregate P:D`` -> (prefill ranks, decode ranks)."""
    try:
        num_prefill, num_decode = (int(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"--disaggregate: expected P:D like 2:8, got {text!r}") from None
    if num_prefill < 1 or num_decode < 1:
        raise ValueError(f"--disaggregate: both groups need >= 1 rank, got {text!r}")
    return num_prefill, num_decode


def role_args(
    fused: ServerArgs, num_prefill: int, num_decode: int
) -> tuple[ServerArgs, ServerArgs]:
    """The two roles' args from a fused group's (``roundgate.actors.pd_roles`` builds them):
    the same model, pages and per-rank limits (``max_num_seqs`` per rank kept), no prefill
    policy (the roles run none)."""
    per_rank = fused.max_batch_size
    shared = fused.replace(prefill_policy="none", **dict.fromkeys(fused.policy_flags)).to_dict()
    sections = {
        role: {"dp_size": size, "max_num_seqs": per_rank * size}
        for role, size in zip(pd_roles.PD_ROLES, (num_prefill, num_decode), strict=True)
    }
    return pd_roles.role_server_args(shared, sections)


def simulate_pd(spec, num_prefill: int, num_decode: int) -> tuple[SimResult, PDSimulator]:
    """Run ``spec``'s workload (drawn: ``roundgate.sim.spec.arrivals_of``) on a P/D split of its
    group; the router is the spec's, over the prefill ranks."""
    from roundgate.sim.spec import arrivals_of

    prefill, decode = role_args(spec.args, num_prefill, num_decode)
    sim = PDSimulator(
        prefill,
        decode,
        spec.costs,
        spec.router.build(num_prefill, spec.seed, prefill.page_size),
        label=f"pd {num_prefill}:{num_decode}",
    )
    return sim.run(arrivals_of(spec), spec.concurrency, spec.itl_slo_ms), sim


def disaggregated_flags(ns, split: tuple[int, int]) -> dict[str, Any]:
    """``roundgate simulate --disaggregate P:D``'s fused arms, as the flags they change (for
    ``sim_specs``): ``none`` and ``roundgate`` (unless ``--compare`` names others) on P+D
    ranks, ``--max-num-seqs`` per rank kept."""
    if getattr(ns, "plot", None) is not None:
        raise ValueError("--disaggregate does not draw plots (--plot): P/D has no timeline")
    registry.check_pd(ns.router, flag)
    num_prefill, num_decode = split
    per_rank = ns.max_num_seqs // ns.dp_size
    if per_rank < 1:
        raise ValueError(f"--max-num-seqs {ns.max_num_seqs} gives no slot per rank")
    return {
        "dp_size": num_prefill + num_decode,
        "max_num_seqs": per_rank * (num_prefill + num_decode),
        "compare": ns.compare or "none,roundgate",
    }


def describe_transfers(sim: PDSimulator) -> str:
    """One line on what moved between the groups."""
    times = sorted(sim.transfer_ms)
    if not times:
        return "no transfers"
    p50 = times[len(times) // 2]
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    return (
        f"{sim.num_transfers} transfers, {sim.num_pages_moved} pages moved, "
        f"{sim.num_pages_cached} already cached on the decode rank; reserved -> arrived "
        f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    )
