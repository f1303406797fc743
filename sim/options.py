"""``roundgate simulate``/``tune`` flags -> validated ``SimSpec``s: costs, workload, policies.

The command line is the only place that reads flags: ``sim_specs`` turns the parsed ones into
one spec per policy, every value checked before any simulated round; the helpers take plain
values, so a replay of recorded flags (``roundgate.sim.live_check``) builds its spec the same way.
Every refusal is a ``ValueError`` whose message names the flag; the commands turn it into an
argparse error (one line, exit code 2).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from roundgate.actors.server_args import ServerArgs
from roundgate.gate import registry
from roundgate.routing import registry as routers
from roundgate.routing.cache_aware import CacheAwareConfig
from roundgate.routing.kv_router import KvRouterConfig
from roundgate.routing.spec import flag
from roundgate.sim.expert_options import expert_spec
from roundgate.sim.kv_channel import ChannelSpec
from roundgate.sim.round_costs import COST_FIELDS, RoundCosts, load_costs
from roundgate.sim.router import RouterSpec
from roundgate.sim.sessions import SESSION_WORKLOADS, SessionSpec
from roundgate.sim.spec import SimSpec, Workload, arrivals_of
from roundgate.sim.speculation import spec_of
from roundgate.sim.workload import WORKLOADS, WorkloadSpec

COST_FLAGS = COST_FIELDS
# The group flags' defaults: the simulate command's, and a replayed run's where it sets none.
GROUP_DEFAULTS: Mapping[str, int] = {
    "dp_size": 8,
    "max_num_seqs": 1024,
    "max_scheduled_tokens": 8192,
    "page_size": 64,
    "num_kv_pages": 4096,
}
# The workload flags' defaults (the lengths: without --workload, or where it leaves them open).
WORKLOAD_DEFAULTS: Mapping[str, Any] = {
    "num_requests": 500,
    "arrival": "poisson",
    "rate": 20.0,
    "burst_size": 8,
    "seed": 0,
}
BASE_LENGTHS: Mapping[str, Any] = {"input_len": 1000, "output_len": 200, "length_dist": "fixed"}
# The KV-event channel's flags (the simulator's, for the routers that read the events) ->
# ``ChannelSpec`` fields.
CHANNEL_FLAGS = {
    "kv_event_lag_rounds": "lag_rounds",
    "kv_event_loss": "loss_rate",
    "kv_snapshot_rounds": "snapshot_rounds",
}


def resolve_costs(source: str, overrides: Mapping[str, float | None]) -> RoundCosts:
    """``--costs`` preset or JSON file, then the per-field override flags given (None: not)."""
    text = None
    if source.endswith(".json"):
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise ValueError(f"--costs {source}: cannot read ({exc.strerror})") from exc
    try:
        costs = load_costs(source, text)
    except ValueError as exc:
        # RoundCosts' own refusals name the field, not the flag: say which flag supplied it.
        message = str(exc)
        if not message.startswith("--costs"):
            message = f"--costs {source}: {message}"
        raise ValueError(message) from exc
    given = {name: value for name, value in overrides.items() if value is not None}
    for name, value in given.items():
        if not value >= 0:  # also refuses NaN
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
    if given:
        values = {n: getattr(costs, n) for n in COST_FLAGS} | given
        try:
            costs = RoundCosts(**values)
        except ValueError as exc:
            raise ValueError(f"--{str(exc).split()[1].replace('_', '-')}: {exc}") from exc
    return costs


def resolve_lengths(
    workload: str | None, input_len: int | None, output_len: int | None, length_dist: str | None
) -> dict[str, Any]:
    """The length flags: as given, else ``--workload``'s preset, else the base ones."""
    preset = None
    if workload is not None and workload not in SESSION_WORKLOADS:
        if workload not in WORKLOADS:
            known = ", ".join([*WORKLOADS, *SESSION_WORKLOADS])
            raise ValueError(f"--workload must be one of {known}, got {workload!r}")
        preset = WORKLOADS[workload]
    given = {"input_len": input_len, "output_len": output_len, "length_dist": length_dist}
    return {
        name: given[name] if given[name] is not None else getattr(preset, name, base)
        for name, base in BASE_LENGTHS.items()
    }


def policies_of(policy: str, compare: str | None) -> list[str]:
    """``--policy``, or the ``--compare`` list (``all`` = every policy)."""
    known = registry.names()
    if compare is None:
        names = [policy]
    elif compare == "all":
        names = list(known)
    else:
        names = [s.strip() for s in compare.split(",")]
    for name in names:
        if name not in known:
            flag = "--policy" if compare is None else "--compare"
            raise ValueError(f"{flag}: unknown policy {name!r} (policies: {', '.join(known)})")
    return names


def policy_args(policy: str, given: Mapping[str, Any], **group: Any) -> ServerArgs:
    """The engine flags one policy runs with: its own flags from ``given`` (by flag name;
    another policy's are not its to read), else simulate's defaults; ``group`` (the dp size,
    the limits) is shared by every policy of a comparison."""
    return ServerArgs(**group, prefill_policy=policy, **registry.comparison_flags(policy, given))


def router_spec(
    policy: str, args: ServerArgs, given: Mapping[str, Any] | None = None
) -> RouterSpec:
    """``--router`` and its flags (``given`` by name; missing or None: not given), each checked
    against the routers' declarations (``roundgate.routing.registry``); the cache-aware index and
    the cost routers sized like the ranks' pools; the KV-event channel for the routers that read
    the events."""
    given = given or {}
    values = {o.name: o.parse(given.get(o.name)) for o in routers.options("simulate")}
    entry = routers.get(policy, "simulate", flag)
    routers.check((policy,), values, args.dp_size, "simulate", flag)
    arguments = entry.arguments(values, args)
    cache_aware = CacheAwareConfig(**arguments) if policy == "cache-aware" else None
    kv = KvRouterConfig(**arguments) if entry.reads_kv_events else None
    channel = channel_spec(policy, given)
    return RouterSpec(
        policy, values["route_weights"], cache_aware, values["lb_api_servers"], kv, channel
    )


def channel_spec(policy: str, given: Mapping[str, Any]) -> ChannelSpec | None:
    """The KV-event channel from its flags, for a router that reads the events; refused (by
    flag) for another router."""
    named = {k: given[k] for k in CHANNEL_FLAGS if given.get(k) is not None}
    kv_routers = routers.kv_event_routers("simulate")
    if policy not in kv_routers:
        if named:
            raise ValueError(
                f"{flag(next(iter(named)))} applies to --router {', '.join(kv_routers)} only"
            )
        return None
    return ChannelSpec(**{CHANNEL_FLAGS[k]: v for k, v in named.items()})


def sim_specs(ns: argparse.Namespace, **overrides: Any) -> list[SimSpec]:
    """One validated spec per policy (``--policy`` or ``--compare``), all on one workload
    drawn here (so a workload a rank could never run is refused before any round).

    ``overrides`` replace parsed flags by their ``ns`` names (``--disaggregate``'s fused arms).
    """
    given = vars(ns) | overrides
    policies = policies_of(given["policy"], given["compare"])
    costs = resolve_costs(given["costs"], {name: given.get(name) for name in COST_FLAGS})
    lengths = resolve_lengths(
        given["workload"], given["input_len"], given["output_len"], given["length_dist"]
    )
    workload: Workload = WorkloadSpec(
        num_requests=given["num_requests"],
        arrival=given["arrival"],
        rate=given["rate"],
        burst_size=given["burst_size"],
        trace=given["trace"],
        seed=given["seed"],
        **lengths,
    )
    group = {name: given[name] for name in GROUP_DEFAULTS}
    group["enable_mixed_prefill_decode"] = given["enable_mixed_prefill_decode"]
    group["enable_prefix_caching"] = given.get("enable_prefix_caching", True)
    args = {policy: policy_args(policy, given, **group) for policy in policies}
    first = args[policies[0]]
    if given["workload"] in SESSION_WORKLOADS:
        workload = SessionSpec(
            SESSION_WORKLOADS[given["workload"]],
            num_sessions=given.get("num_sessions", 64),
            rate=given["rate"],
            vocab_size=first.model_config.vocab_size,
            seed=given["seed"],
        )
    router = router_spec(given["router"], first, given)
    spec = SimSpec(
        first,
        workload,
        costs,
        router,
        seed=given["seed"],
        concurrency=given.get("concurrency"),
        max_rounds=given.get("max_rounds"),
        keep_timeline=given.get("plot") is not None,
        experts=expert_spec(given, given["costs"], group["dp_size"]),
        speculation=spec_of(given),
    )
    drawn = arrivals_of(spec)
    return [replace(spec, args=args[policy], workload=drawn) for policy in policies]
