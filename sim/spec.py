"""One simulation run, typed: a frozen ``SimSpec`` in, a ``SimResult`` out.

Everything that drives the simulator (``roundgate simulate`` and ``tune``, the scenario
replays, the live check of a bench run, the benchmarks) builds a ``SimSpec`` and calls
``simulate``; only the command line reads flags (``roundgate.sim.options``). A spec refuses what it
cannot run when it is built, and its arrivals when they are drawn, with messages that name
the flag that supplies the value, as the commands report them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from roundgate.actors.server_args import ServerArgs
from roundgate.gate import registry
from roundgate.sim.arrivals import Arrival
from roundgate.sim.expert_parallel import ExpertSpec
from roundgate.sim.records import SimResult
from roundgate.sim.round_costs import TOY, RoundCosts
from roundgate.sim.router import RouterSpec
from roundgate.sim.sessions import SESSION_WORKLOADS, SessionSpec, make_sessions, max_prompt_tokens
from roundgate.sim.simulator import GroupSimulator
from roundgate.sim.speculation import SpecSim
from roundgate.sim.workload import WorkloadSpec, generate

# What a run sends: a seeded synthetic workload (or a trace), multi-turn sessions, or a list
# already drawn (so several runs can share one, and a benchmark can draw it outside its clock).
Workload = WorkloadSpec | SessionSpec | tuple[Arrival, ...]


@dataclass(frozen=True)
class SimSpec:
    """Everything one simulation run needs; the same spec gives the same result."""

    # The group's engine flags; their prefill policy is the one simulated (and labels the result).
    args: ServerArgs
    workload: Workload = field(default_factory=WorkloadSpec)
    costs: RoundCosts = TOY
    router: RouterSpec = field(default_factory=RouterSpec)
    seed: int = 0  # the router's draws; a workload spec carries its own seed
    # N closed-loop clients sending the workload's requests (their lengths, in order) instead
    # of at the workload's times; None: open loop.
    concurrency: int | None = None
    max_rounds: int | None = None  # stop after this many group rounds (None: until all finish)
    keep_timeline: bool = False  # record every round (plots); slower, no fast-forward
    # Each request counts its inter-token gaps above this as it runs, so goodput's ITL-p99
    # SLO can be judged without keeping every request's gaps (sim/goodput.py).
    itl_slo_ms: float = float("inf")
    # The MoE layers' expert popularity and placement (None: priced at the mean expert load).
    experts: ExpertSpec | None = None
    # Speculative decoding: drafts per decode, their acceptance and cost (None: none).
    speculation: SpecSim | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {self.concurrency}")
        if not self.itl_slo_ms > 0:
            raise ValueError(f"--slo-itl-ms must be > 0, got {self.itl_slo_ms}")
        if self.max_rounds is not None and self.max_rounds < 1:
            raise ValueError(f"--max-rounds must be >= 1, got {self.max_rounds}")
        if self.experts is not None and self.experts.dp_size != self.args.dp_size:
            raise ValueError(
                f"--expert-placement: the expert layout is for {self.experts.dp_size} ranks, "
                f"--dp-size is {self.args.dp_size}"
            )
        self.router.build(
            self.args.dp_size, self.seed, self.args.page_size
        )  # refuses its settings now, not mid-run
        self.router.check_policy(self.policy)

    @property
    def policy(self) -> str:
        """The prefill policy simulated (the result's label)."""
        return self.args.prefill_policy_name

    def with_policy(self, policy: str, given: Mapping[str, Any]) -> SimSpec:
        """The same run under ``policy``: its own flags from ``given`` (by flag name), else
        simulate's defaults; the current policy's flags are dropped."""
        flags = dict.fromkeys(self.args.policy_flags) | registry.comparison_flags(policy, given)
        return replace(self, args=self.args.replace(prefill_policy=policy, **flags))


def arrivals_of(spec: SimSpec) -> tuple[Arrival, ...]:
    """The run's arrivals (a session workload's first turns; the rest follow as they finish),
    refused as flag errors where a rank could never run one (else they fail mid-run)."""
    workload, args = spec.workload, spec.args
    capacity = args.num_kv_pages * args.page_size
    pool = f"--num-kv-pages {args.num_kv_pages} x --page-size {args.page_size}"
    if isinstance(workload, SessionSpec):
        sessions = make_sessions(workload)
        longest = max(max_prompt_tokens(session) for session in sessions)
        if longest + 1 > capacity:
            raise ValueError(
                f"--workload {_session_workload(workload)}: a session grows to {longest} "
                f"tokens, more than one rank's KV pool ({pool})"
            )
        return tuple(session.first_turn() for session in sessions)
    if isinstance(workload, WorkloadSpec):
        arrivals = tuple(generate(workload))
        trace = workload.trace if workload.arrival == "trace" else None
    else:
        arrivals, trace = workload, None
    source = f"--trace {trace}" if trace is not None else "--input-len"
    for index, arrival in enumerate(arrivals):
        if arrival.rank is not None and not 0 <= arrival.rank < args.dp_size:
            raise ValueError(
                f"--trace {trace}: request {index} pins rank {arrival.rank}, outside "
                f"--dp-size {args.dp_size}"
            )
        if arrival.prompt_tokens + 1 > capacity:
            raise ValueError(
                f"{source}: a prompt of {arrival.prompt_tokens} tokens does not fit one rank's "
                f"KV pool ({pool} = {capacity} tokens, one kept for the first output token)"
            )
    return arrivals


def _session_workload(spec: SessionSpec) -> str:
    """The ``--workload`` name of a session spec's preset (a changed preset has none)."""
    names = [name for name, preset in SESSION_WORKLOADS.items() if preset == spec.preset]
    return names[0] if names else "sessions"


def simulate(spec: SimSpec, on_round: Callable[[int, int], None] | None = None) -> SimResult:
    """Run ``spec`` on a fresh group and router; ``on_round(rounds, finished)`` after each step
    (a progress bar)."""
    arrivals = arrivals_of(spec)
    sim = GroupSimulator(
        spec.args,
        spec.costs,
        spec.router.build(spec.args.dp_size, spec.seed, spec.args.page_size),
        spec.policy,
        keep_timeline=spec.keep_timeline,
        experts=spec.experts,
        speculation=spec.speculation,
        seed=spec.seed,
    )
    return sim.run(
        arrivals,
        spec.max_rounds,
        on_round,
        concurrency=spec.concurrency,
        itl_slo_ms=spec.itl_slo_ms,
    )
