"""Turning ``roundgate simulate``/``tune`` flags into validated runs: costs, workload, policies.

Every refusal is a ``ValueError`` whose message names the flag; the commands turn it into an
argparse error (one line, exit code 2).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.server_args import ServerArgs
from deployment.routing.cache_aware import CacheAwareConfig
from gate import registry
from sim.round_costs import COST_FIELDS, RoundCosts, load_costs
from sim.sessions import SESSION_WORKLOADS, SessionSpec, first_turns, max_prompt_tokens
from sim.workload import WORKLOADS, Arrival, Router, WorkloadSpec, generate

COST_FLAGS = COST_FIELDS
# Without --workload (or where it leaves them open), the lengths the simulator always used.
BASE_LENGTHS = {"input_len": 1000, "output_len": 200, "length_dist": "fixed"}


@dataclass
class RunSetup:
    """Everything a simulate run needs, validated up front."""

    policies: list[str]
    args: dict[str, ServerArgs]
    costs: RoundCosts
    spec: WorkloadSpec
    weights: list[int] | None


def resolve_costs(ns: argparse.Namespace) -> RoundCosts:
    """``--costs`` preset or JSON file, then any per-field override flags."""
    text = None
    if ns.costs.endswith(".json"):
        try:
            text = Path(ns.costs).read_text()
        except OSError as exc:
            raise ValueError(f"--costs {ns.costs}: cannot read ({exc.strerror})") from exc
    try:
        costs = load_costs(ns.costs, text)
    except ValueError as exc:
        # RoundCosts' own refusals name the field, not the flag: say which flag supplied it.
        message = str(exc)
        if not message.startswith("--costs"):
            message = f"--costs {ns.costs}: {message}"
        raise ValueError(message) from exc
    overrides = {n: getattr(ns, n) for n in COST_FLAGS if getattr(ns, n, None) is not None}
    for name, value in overrides.items():
        if not value >= 0:  # also refuses NaN
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
    if overrides:
        values = {n: getattr(costs, n) for n in COST_FLAGS} | overrides
        try:
            costs = RoundCosts(**values)
        except ValueError as exc:
            raise ValueError(f"--{str(exc).split()[1].replace('_', '-')}: {exc}") from exc
    return costs


def resolve_lengths(ns: argparse.Namespace) -> None:
    """Fill unset length flags from ``--workload`` (explicit flags win), else the base ones."""
    preset = None
    if ns.workload is not None and ns.workload not in SESSION_WORKLOADS:
        if ns.workload not in WORKLOADS:
            known = ", ".join([*WORKLOADS, *SESSION_WORKLOADS])
            raise ValueError(f"--workload must be one of {known}, got {ns.workload!r}")
        preset = WORKLOADS[ns.workload]
    for name, base in BASE_LENGTHS.items():
        if getattr(ns, name) is None:
            setattr(ns, name, getattr(preset, name) if preset is not None else base)


def policies_of(ns: argparse.Namespace) -> list[str]:
    """``--policy``, or the ``--compare`` list (``all`` = every policy)."""
    known = registry.names()
    if ns.compare is None:
        names = [ns.policy]
    elif ns.compare == "all":
        names = list(known)
    else:
        names = [s.strip() for s in ns.compare.split(",")]
    for name in names:
        if name not in known:
            flag = "--policy" if ns.compare is None else "--compare"
            raise ValueError(f"{flag}: unknown policy {name!r} (policies: {', '.join(known)})")
    return names


def server_args_for(ns: argparse.Namespace, policy: str, **overrides: Any) -> ServerArgs:
    """The engine flags one policy runs with (its own flags: given, else simulate's
    defaults); the rest of the group config is shared."""
    own = registry.comparison_flags(policy, vars(ns))
    return ServerArgs(
        dp_size=ns.dp_size,
        max_num_seqs=ns.max_num_seqs,
        max_scheduled_tokens=ns.max_scheduled_tokens,
        page_size=ns.page_size,
        num_kv_pages=ns.num_kv_pages,
        enable_mixed_prefill_decode=ns.enable_mixed_prefill_decode,
        enable_prefix_caching=getattr(ns, "enable_prefix_caching", True),
        prefill_policy=policy,
        **(own | overrides),
    )


def route_weights(ns: argparse.Namespace) -> list[int] | None:
    if ns.route_weights is None:
        return None
    try:
        return [int(w) for w in ns.route_weights.split(",")]
    except ValueError:
        raise ValueError(
            f"--route-weights: expected integers like 8,1,1,1, got {ns.route_weights!r}"
        ) from None


def workload_spec(ns: argparse.Namespace) -> WorkloadSpec:
    resolve_lengths(ns)
    return WorkloadSpec(
        num_requests=ns.num_requests,
        arrival=ns.arrival,
        rate=ns.rate,
        burst_size=ns.burst_size,
        input_len=ns.input_len,
        output_len=ns.output_len,
        length_dist=ns.length_dist,
        trace=ns.trace,
        seed=ns.seed,
    )


def prepare(ns: argparse.Namespace) -> RunSetup:
    """Validate every flag up front (before any simulated round)."""
    policies = policies_of(ns)
    costs = resolve_costs(ns)
    spec = workload_spec(ns)
    weights = route_weights(ns)
    make_router(ns, weights)  # validates router flags
    args = {p: server_args_for(ns, p) for p in policies}
    concurrency = getattr(ns, "concurrency", None)
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
    if ns.max_rounds is not None and ns.max_rounds < 1:
        raise ValueError(f"--max-rounds must be >= 1, got {ns.max_rounds}")
    return RunSetup(policies, args, costs, spec, weights)


def check_arrivals(arrivals: list[Arrival], args: ServerArgs, ns: argparse.Namespace) -> None:
    """Refuse, as flag errors, workloads a rank could never run (else they fail mid-run)."""
    source = f"--trace {ns.trace}" if ns.arrival == "trace" else "--input-len"
    capacity = args.num_kv_pages * args.page_size
    for index, arrival in enumerate(arrivals):
        if arrival.rank is not None and not 0 <= arrival.rank < args.dp_size:
            raise ValueError(
                f"--trace {ns.trace}: request {index} pins rank {arrival.rank}, outside "
                f"--dp-size {args.dp_size}"
            )
        if arrival.prompt_tokens + 1 > capacity:
            raise ValueError(
                f"{source}: a prompt of {arrival.prompt_tokens} tokens does not fit one rank's "
                f"KV pool (--num-kv-pages {args.num_kv_pages} x --page-size {args.page_size} = "
                f"{capacity} tokens, one kept for the first output token)"
            )


def make_router(ns: argparse.Namespace, weights: list[int] | None) -> Router:
    """A fresh router for one run (the cache-aware one sized like the ranks' pools)."""
    cache_aware = None
    if ns.router == "cache-aware":
        cache_aware = CacheAwareConfig(
            page_size=ns.page_size,
            max_pages_per_rank=ns.num_kv_pages,
            balance_abs_threshold=getattr(ns, "balance_abs_threshold", 32),
            balance_rel_threshold=getattr(ns, "balance_rel_threshold", 1.0001),
            session_affinity=getattr(ns, "session_affinity", False),
        )
    servers = getattr(ns, "lb_api_servers", None)
    return Router(ns.router, ns.dp_size, weights, ns.seed, cache_aware, servers)


def arrivals_of(ns: argparse.Namespace, setup: RunSetup) -> list[Arrival]:
    """The run's arrivals: a session workload's first turns, else the generated workload."""
    if ns.workload not in SESSION_WORKLOADS:
        return generate(setup.spec)
    args = setup.args[setup.policies[0]]
    spec = SessionSpec(
        SESSION_WORKLOADS[ns.workload],
        num_sessions=getattr(ns, "num_sessions", 64),
        rate=ns.rate,
        vocab_size=args.model_config.vocab_size,
        seed=ns.seed,
    )
    arrivals = first_turns(spec)
    capacity = args.num_kv_pages * args.page_size
    longest = max(max_prompt_tokens(a.session) for a in arrivals if a.session is not None)
    if longest + 1 > capacity:
        raise ValueError(
            f"--workload {ns.workload}: a session grows to {longest} tokens, more than one "
            f"rank's KV pool (--num-kv-pages {args.num_kv_pages} x --page-size {args.page_size})"
        )
    return arrivals
