"""P/D in the simulator: a prefill group and a decode group of the real control plane.

Each group is a ``RankLoop`` per rank over the role's scheduler (``--disaggregation-mode
prefill`` / ``decode``, ``actors.control.prefill_role`` and ``decode_role``), with its own
round clock: a group round costs its slowest rank (``RoundCosts.group_ms``; the decode group
never extends, so it never pays ``extend_overhead_ms``). The two groups run side by side; the
simulator always steps the one whose clock is behind, so what one group hands the other is
seen no earlier than it was sent.

    arrival ─► router ─► prefill rank ── Handoff at its round's end ──► least-loaded decode rank
                                        (pages pinned)                  waits, then reserves
    transfer: starts when the decode plan reserved (both ends' links free), lasts
    RoundCosts.transfer_ms; at its end the prefill rank releases and the decode rank decodes.

The prefill router is the fused runs' (``--router``) over the prefill ranks. Under the kv
routers (``kv-aware``, ``oracle``) both choices read the ranks' own KV events, as the served
P/D does under ``router: kv-aware``: each group's pools publish through a ``KvChannel`` (the
run's lag and loss); the prefill rank is kv-aware's least cost (uncached prompt tokens, then
backlog), the decode rank the least reported decode load (``deployment.routing.decode_load``).
Under the other routers a handoff goes to the decode rank with the fewest requests (held,
waiting or on their way). ``gate-aware`` is refused: neither group runs the gate.

A request's first token reaches its client from the decode rank, in the round its KV arrived
(as the served path streams it), so TTFT counts the transfer and the wait for decode capacity.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque

from actors.control.handoff import Handoff
from actors.control.rank_loop import RoundOutcome
from actors.control.request import Request, SamplingParams
from actors.disaggregated import check_roles
from actors.server_args import ServerArgs
from deployment.routing.decode_load import DecodeLoadPolicy
from gate import read_rows
from sim.arrivals import Arrival
from sim.cost_executor import cost_loops
from sim.kv_channel import KvChannel
from sim.prompts import FillerPrompts
from sim.records import RequestRecord, SimResult
from sim.round_costs import RoundCosts
from sim.router import Router
from sim.sessions import arrival_source

IDLE_ROUND_MS = 0.01
INF = float("inf")


class _Group:
    """One role's ranks and their clock."""

    def __init__(self, args: ServerArgs, costs: RoundCosts, clock: list[float]) -> None:
        self.args = args
        self.costs = costs
        self.loops = cost_loops(args, costs, lambda: clock[0])
        self.schedulers = [loop.scheduler for loop in self.loops]
        self.clock = 0.0
        self.stalled = False  # its last round was idle: it waits for an event
        self.rounds = self.busy_rounds = 0
        self.num_extends = 0  # prefill chunks run (a decode group's stays 0)

    @property
    def has_work(self) -> bool:
        return not self.stalled and any(s.has_unfinished for s in self.schedulers)

    def step_unfinished(self, channel: KvChannel | None) -> tuple[float, list[RoundOutcome]] | None:
        """``step`` when a rank holds unfinished work (None, no round, otherwise); the round's
        KV events then go out on ``channel``."""
        if not any(s.has_unfinished for s in self.schedulers):
            return None
        stepped = self.step()
        if channel is not None:
            channel.tick(self.rounds, self.clock)
        return stepped

    def step(self) -> tuple[float, list[RoundOutcome]]:
        """One group round; returns its start and every rank's outcome."""
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
        return start, outcomes


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
        check_roles(prefill_args, decode_args)
        check_pd_router(router.policy)
        self.costs = costs
        self.router = router
        self.label = label
        self.now = [0.0]  # the clock the policies' ``now_ms`` column reads
        self.prefill = _Group(prefill_args, costs, self.now)
        self.decode = _Group(decode_args, costs, self.now)
        for rank, scheduler in enumerate(self.prefill.schedulers):
            scheduler.handoffs.rank = rank
        self.page_size = decode_args.page_size
        self._prompts = FillerPrompts(prefill_args.model_config.vocab_size)
        self.num_transfers = self.num_pages_moved = self.num_pages_cached = 0
        self.transfer_ms: list[float] = []  # per transfer: reserved -> arrived
        # The kv routers: each group's pools publish to its router's index (the decode
        # role's on the same channel settings, with its own policy).
        self.p_channel = self.d_channel = None
        self.decode_policy: DecodeLoadPolicy | None = None
        if router.kv is not None:
            self.p_channel = KvChannel(router.channel, self.prefill.schedulers, router.kv.index)
            self.decode_policy = DecodeLoadPolicy(router.kv.config)
            self.d_channel = KvChannel(
                router.channel, self.decode.schedulers, self.decode_policy.index
            )
        self._p_sources = [str(r) for r in range(prefill_args.dp_size)]
        self._d_sources = [str(r) for r in range(decode_args.dp_size)]

    def run(self, arrivals: list[Arrival] | tuple[Arrival, ...], concurrency: int | None = None):
        """Simulate until every request finishes; a ``SimResult`` like a fused run's."""
        p, d = self.prefill, self.decode
        source = arrival_source(arrivals, concurrency)
        lag_s = self.costs.schedule_lag_ms / 1000.0
        records: dict[str, RequestRecord] = {}
        itl = array("d")
        sent: deque[tuple[float, int, int, Arrival]] = deque()  # routed, reaching its rank
        handed: deque[tuple[float, int, Handoff]] = deque()  # (visible, decode rank, handoff)
        arrived: list[tuple[float, int, str]] = []  # heap: (time, decode rank, id)
        released: list[tuple[float, int, str]] = []  # heap: (time, prefill rank, id)
        p_link = [0.0] * p.args.dp_size
        d_link = [0.0] * d.args.dp_size
        d_routed = [0] * d.args.dp_size  # handoffs on their way to each decode rank
        finished = 0
        while True:
            p_next = p.clock if p.has_work else _first(source.next_send_s, sent, released)
            d_next = d.clock if d.has_work else _first(INF, handed, arrived)
            if p_next == INF and d_next == INF:
                break
            if p_next <= d_next:
                p.clock = max(p.clock, p_next)
                self.now[0] = p.clock
                while source.next_send_s <= p.clock:
                    index, arrival = source.pop()
                    rank = self._route(arrival, index, sent, p.clock)
                    sent.append((arrival.time_s + lag_s, rank, index, arrival))
                while sent and sent[0][0] <= p.clock:
                    _, rank, index, arrival = sent.popleft()
                    self._admit(arrival, rank, index, records)
                    p.stalled = False
                while released and released[0][0] <= p.clock:
                    _, rank, rid = heapq.heappop(released)
                    p.schedulers[rank].handoffs.release(rid)
                    p.stalled = False
                stepped = p.step_unfinished(self.p_channel)
                if stepped is None:
                    continue
                for outcome in stepped[1]:
                    for handoff in outcome.handoffs:
                        loads = [len(s.requests) + d_routed[r] for r, s in enumerate(d.schedulers)]
                        rank = self._route_decode(handoff, loads, p.clock)
                        d_routed[rank] += 1
                        handed.append((p.clock, rank, handoff))
                    finished += self._record(outcome, p.clock, records, itl, source)
                continue
            d.clock = max(d.clock, d_next)
            self.now[0] = d.clock
            while handed and handed[0][0] <= d.clock:
                _, rank, handoff = handed.popleft()
                d_routed[rank] -= 1
                d.schedulers[rank].intake.add(handoff)
                d.stalled = False
            while arrived and arrived[0][0] <= d.clock:
                _, rank, rid = heapq.heappop(arrived)
                d.schedulers[rank].intake.arrived(rid)
                d.stalled = False
            stepped = d.step_unfinished(self.d_channel)
            if stepped is None:
                continue
            start, outcomes = stepped
            for rank, outcome in enumerate(outcomes):
                for reservation in outcome.plan.reservations:
                    source_rank = reservation.handoff.source_rank
                    pages = len(reservation.page_indices)
                    busy_ms, done_ms = self.costs.transfer_ms(pages, self.page_size)
                    begin = max(start, p_link[source_rank], d_link[rank])
                    p_link[source_rank] = d_link[rank] = begin + busy_ms / 1000.0
                    done = begin + done_ms / 1000.0
                    heapq.heappush(arrived, (done, rank, reservation.request_id))
                    heapq.heappush(released, (done, source_rank, reservation.request_id))
                    self.num_transfers += 1
                    self.num_pages_moved += pages
                    self.num_pages_cached += reservation.num_cached_pages
                    self.transfer_ms.append((done - start) * 1000.0)
                finished += self._record(outcome, d.clock, records, itl, source)
        return SimResult(
            policy=self.label,
            dp_size=p.args.dp_size + d.args.dp_size,
            duration_s=max(p.clock, d.clock),
            rounds=p.rounds + d.rounds,
            busy_rounds=p.busy_rounds + d.busy_rounds,
            prefill_rounds=p.busy_rounds,
            decode_rounds=d.busy_rounds,
            records=list(records.values()),
            itl_ms=itl,
            timeline=None,
            unfinished=len(records) - finished,
            prefix_queries=sum(s.prefix.num_queries for s in p.schedulers),
            prefix_hits=sum(s.prefix.num_hits for s in p.schedulers),
        )

    def _route(self, arrival: Arrival, index: int, sent: deque, now_s: float) -> int:
        """The prefill rank a request goes to (the fused runs' router, over the P group)."""
        schedulers = self.prefill.schedulers
        loads = [len(s.requests) for s in schedulers]
        for _, rank, _, _ in sent:
            loads[rank] += 1
        session = None if arrival.session is None else str(arrival.session.session_id)
        if self.router.kv is not None:
            match = self.router.matcher(schedulers)
            prompt = self._prompts.make(index, arrival)
            choice = self.router.kv.choose(self._p_sources, loads, prompt, now_s, session, match)
            return int(choice.rank)
        if self.router.policy == "cache-aware":
            return self.router.route(loads, self._prompts.make(index, arrival), session)
        if self.router.policy == "vllm-lb":
            waiting = [len(s.waiting) for s in schedulers]
            return self.router.route_stale(self.prefill.clock, waiting, loads)
        return self.router.route(loads)

    def _route_decode(self, handoff: Handoff, loads: list[int], now_s: float) -> int:
        """The decode rank a handoff goes to: the least reported decode load (kv routers),
        else the fewest requests (``loads``: held, waiting or on their way)."""
        if self.decode_policy is None:
            return min(range(len(loads)), key=lambda r: (loads[r], r))
        choice = self.decode_policy.choose(self._d_sources, loads, handoff.prompt_token_ids, now_s)
        return int(choice.rank)

    def _admit(
        self, arrival: Arrival, rank: int, index: int, records: dict[str, RequestRecord]
    ) -> None:
        request_id = f"req-{index}"
        sampling = SamplingParams(max_tokens=arrival.output_tokens)
        request = Request(request_id, self._prompts.make(index, arrival), sampling)
        self.prefill.schedulers[rank].add_request(request)
        records[request_id] = RequestRecord(
            rank, arrival.time_s, arrival.prompt_tokens, turn=arrival.turn
        )

    @staticmethod
    def _record(outcome: RoundOutcome, now: float, records, itl: array, source) -> int:
        """A round's tokens into the records; returns how many requests finished."""
        finished = 0
        for request, token_id, done in outcome.events:
            rec = records[request.request_id]
            if token_id is not None:
                if rec.first_token_s is None:
                    rec.first_token_s = now
                else:
                    itl.append((now - rec.last_token_s) * 1000.0)
                rec.last_token_s = now
                rec.num_output += 1
            if done:
                rec.finish_s = now
                finished += 1
                source.finished(now, request)
        return finished


def _first(after: float, *queues) -> float:
    """The earliest of ``after`` and the queues' first times (a deque's head, a heap's top)."""
    times = [after] + [q[0][0] for q in queues if q]
    return min(times)


def check_pd_router(router: str) -> None:
    """``gate-aware`` reads the group gate, which neither P/D group runs: refused."""
    if router == "gate-aware":
        raise ValueError(
            "--router gate-aware: P/D runs no prefill gate (the prefill group only prefills, "
            "the decode group only decodes); use --router kv-aware with --disaggregate"
        )


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
    """The two roles' args from a fused group's: the same model, pages and per-rank limits
    (``max_num_seqs`` per rank kept), no prefill policy (the roles run none)."""
    per_rank = fused.max_batch_size
    base = fused.replace(prefill_policy="none", **dict.fromkeys(fused.policy_flags))
    return (
        base.replace(
            disaggregation_mode="prefill", dp_size=num_prefill, max_num_seqs=per_rank * num_prefill
        ),
        base.replace(
            disaggregation_mode="decode", dp_size=num_decode, max_num_seqs=per_rank * num_decode
        ),
    )


def simulate_pd(spec, num_prefill: int, num_decode: int) -> tuple[SimResult, PDSimulator]:
    """Run ``spec``'s workload (drawn: ``sim.spec.arrivals_of``) on a P/D split of its group;
    the router is the spec's, over the prefill ranks."""
    from sim.spec import arrivals_of

    prefill, decode = role_args(spec.args, num_prefill, num_decode)
    sim = PDSimulator(
        prefill,
        decode,
        spec.costs,
        spec.router.build(num_prefill, spec.seed, prefill.page_size),
        label=f"pd {num_prefill}:{num_decode}",
    )
    return sim.run(arrivals_of(spec), spec.concurrency), sim


def disaggregated_namespace(ns, split: tuple[int, int]):
    """``roundgate simulate --disaggregate P:D``'s fused arms: ``none`` and ``roundgate``
    (unless ``--compare`` names others) on P+D ranks, ``--max-num-seqs`` per rank kept."""
    import argparse

    if getattr(ns, "plot", None) is not None:
        raise ValueError("--disaggregate does not draw plots (--plot): P/D has no timeline")
    check_pd_router(ns.router)
    num_prefill, num_decode = split
    per_rank = ns.max_num_seqs // ns.dp_size
    if per_rank < 1:
        raise ValueError(f"--max-num-seqs {ns.max_num_seqs} gives no slot per rank")
    values = vars(ns) | {
        "dp_size": num_prefill + num_decode,
        "max_num_seqs": per_rank * (num_prefill + num_decode),
        "compare": ns.compare or "none,roundgate",
    }
    return argparse.Namespace(**values)


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
