"""``roundgate simulate``: the group simulator's command line."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from roundgate.gate import registry
from roundgate.routing import registry as routers
from roundgate.routing.spec import Option
from roundgate.sim import regime_cli
from roundgate.sim.disaggregated import (
    describe_transfers,
    disaggregated_flags,
    parse_split,
    simulate_pd,
)
from roundgate.sim.expert_options import add_expert_args, describe_experts, refuse_expert_flags
from roundgate.sim.goodput import (
    DEFAULT_ITL_SLO_MS,
    DEFAULT_TTFT_SLO_MS,
    Slo,
    format_goodputs,
    goodput,
)
from roundgate.sim.kv_channel import ChannelSpec
from roundgate.sim.options import (
    BASE_LENGTHS,
    COST_FLAGS,
    GROUP_DEFAULTS,
    WORKLOAD_DEFAULTS,
    resolve_costs,
    resolve_lengths,
    sim_specs,
)
from roundgate.sim.plots import steady_state
from roundgate.sim.records import SimResult
from roundgate.sim.regime_report import format_reports, regime_report
from roundgate.sim.regimes import REGIMES
from roundgate.sim.report import format_table, ratios_to, summarize, write_plots
from roundgate.sim.round_costs import PRESETS, RoundCosts
from roundgate.sim.scenarios import SCENARIOS, format_rows, replay
from roundgate.sim.sessions import SESSION_WORKLOADS
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.speculation import add_spec_args
from roundgate.sim.steady import describe
from roundgate.sim.workload import ARRIVALS, LENGTH_DISTS, WORKLOADS


def add_common_args(p: argparse.ArgumentParser) -> None:
    """The group, cost and workload flags shared by ``simulate`` and ``tune``."""
    group = GROUP_DEFAULTS
    g = p.add_argument_group("group")
    g.add_argument("--dp-size", type=int, default=group["dp_size"])
    g.add_argument(
        "--max-num-seqs",
        type=int,
        default=group["max_num_seqs"],
        help="running requests, whole group",
    )
    g.add_argument("--max-scheduled-tokens", type=int, default=group["max_scheduled_tokens"])
    g.add_argument("--page-size", type=int, default=group["page_size"])
    g.add_argument("--num-kv-pages", type=int, default=group["num_kv_pages"], help="per rank")
    g.add_argument("--enable-mixed-prefill-decode", action="store_true")
    g.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse cached prompt prefixes on each rank",
    )
    g = p.add_argument_group("costs (ms)")
    g.add_argument("--costs", default="toy", help=f"preset ({', '.join(PRESETS)}) or FILE.json")
    for name in COST_FLAGS:
        g.add_argument(
            "--" + name.replace("_", "-"), type=float, default=None, help="override the preset"
        )
    g = p.add_argument_group("workload")
    g.add_argument(
        "--workload",
        default=None,
        help=f"length preset ({', '.join(WORKLOADS)}; --input-len/--output-len/--length-dist "
        f"override it) or multi-turn sessions ({', '.join(SESSION_WORKLOADS)})",
    )
    g.add_argument(
        "--num-sessions",
        type=int,
        default=64,
        help="sessions of a session workload (--rate: new sessions/s)",
    )
    workload = WORKLOAD_DEFAULTS
    g.add_argument("--num-requests", type=int, default=workload["num_requests"])
    g.add_argument("--arrival", default=workload["arrival"], choices=ARRIVALS)
    g.add_argument("--rate", type=float, default=workload["rate"], help="requests/s")
    g.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="closed loop: N clients, each sending its next request when its last finishes "
        "(lengths from the workload; --rate and --arrival are then unused)",
    )
    g.add_argument("--burst-size", type=int, default=workload["burst_size"])
    # Unset lengths come from --workload, else BASE_LENGTHS (named in the help).
    lengths = BASE_LENGTHS
    g.add_argument(
        "--input-len", type=int, default=None, help=f"mean prompt tokens ({lengths['input_len']})"
    )
    g.add_argument(
        "--output-len", type=int, default=None, help=f"mean output tokens ({lengths['output_len']})"
    )
    g.add_argument(
        "--length-dist", default=None, choices=LENGTH_DISTS, help=f"({lengths['length_dist']})"
    )
    g.add_argument("--trace", default=None, help="JSONL arrivals (with --arrival trace)")
    add_router_args(g)
    g.add_argument("--seed", type=int, default=workload["seed"])


def add_router_args(g: argparse._ArgumentGroup) -> None:
    """``--router`` and every simulated router's settings, as the router modules declare
    them (``roundgate.routing.registry``), then the simulated KV-event channel's flags."""
    names = routers.names("simulate")
    summaries = "; ".join(f"{n}: {routers.entry(n).summary}" for n in names)
    g.add_argument("--router", default=routers.DEFAULT, choices=names, help=summaries)
    for option in routers.options("simulate"):
        g.add_argument(option.cli, **_flag_kwargs(option))
    kv_routers = ", ".join(routers.kv_event_routers("simulate"))
    channel = ChannelSpec()
    g.add_argument(
        "--kv-event-lag-rounds",
        type=int,
        default=None,
        help=f"{kv_routers}: rounds a rank's KV events take to reach the router "
        f"({channel.lag_rounds})",
    )
    g.add_argument(
        "--kv-event-loss",
        type=float,
        default=None,
        help=f"{kv_routers}: fraction of event batches lost ({channel.loss_rate})",
    )
    g.add_argument(
        "--kv-snapshot-rounds",
        type=int,
        default=None,
        help=f"{kv_routers}: rounds between snapshots ({channel.snapshot_rounds})",
    )


def _flag_kwargs(option: Option) -> dict:
    """One router setting as an ``add_argument``'s keywords; its help names its routers."""
    help = f"{', '.join(routers.readers(option.name, 'simulate'))}: {option.help}"
    if option.kind is bool:
        return {"action": "store_true", "help": help}
    kind = str if option.kind is tuple else option.kind  # a list is parsed with the others
    return {"type": kind, "default": option.default, "help": help}


def add_policy_args(p: argparse.ArgumentParser) -> None:
    """Every registered policy's own flags; each reaches only its own policy's run."""
    g = p.add_argument_group("policy")
    names = registry.names()
    g.add_argument("--policy", default="roundgate", help=f"one of {', '.join(names)}")
    g.add_argument("--compare", default=None, help="comma-separated policies, or 'all'")
    for name in names:
        for flag in registry.get(name).flags:
            default = "required" if flag.sim_default is None and flag.required else flag.sim_default
            g.add_argument(
                flag.cli,
                type=flag.kind,
                default=None,
                help=f"{flag.help} (--policy {name}: {default})",
            )


def add_slo_args(g: argparse._ArgumentGroup, *aliases: tuple[str, str]) -> None:
    """``--slo-ttft-ms`` and ``--slo-itl-ms`` (goodput, ``roundgate.sim.goodput``); ``aliases`` adds
    older spellings (``tune``'s). Unset: a regime scenario's own SLO, else the defaults."""
    names = dict(aliases)
    g.add_argument(
        "--slo-ttft-ms",
        *([names["ttft"]] if "ttft" in names else []),
        dest="slo_ttft_ms",
        type=float,
        default=None,
        help=f"goodput: a good request's TTFT bound ({DEFAULT_TTFT_SLO_MS:g}; a regime "
        "scenario's own)",
    )
    g.add_argument(
        "--slo-itl-ms",
        *([names["itl"]] if "itl" in names else []),
        dest="slo_itl_ms",
        type=float,
        default=None,
        help=f"goodput: the bound on a good request's own ITL p99 ({DEFAULT_ITL_SLO_MS:g}; a "
        "regime scenario's own)",
    )


def slo_of(ns: argparse.Namespace) -> Slo:
    """The SLO the flags give (each unset one at its default)."""
    ttft = DEFAULT_TTFT_SLO_MS if ns.slo_ttft_ms is None else ns.slo_ttft_ms
    itl = DEFAULT_ITL_SLO_MS if ns.slo_itl_ms is None else ns.slo_itl_ms
    return Slo(ttft, itl)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="run the real control plane for N ranks on a simulated cost clock",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_common_args(p)
    add_policy_args(p)
    p.add_argument(
        "--scenario",
        default=None,
        help="replay a published measurement on its own setup and print published vs "
        f"simulated ({', '.join(SCENARIOS)}), or run a regime's arms with goodput and a "
        f"healthy/LOW regime report ({', '.join(REGIMES)}; --compare replaces its arms); "
        "--costs overrides its preset",
    )
    p.add_argument(
        "--scenario-requests",
        type=int,
        default=None,
        help="with --scenario: send this many requests an arm instead of the run length the "
        "scenario assumes (to see which figures depend on it)",
    )
    p.add_argument(
        "--disaggregate",
        default=None,
        metavar="P:D",
        help="compare fused (none), fused + gate (roundgate) and prefill/decode "
        "disaggregation with P prefill and D decode ranks; the fused runs get P+D ranks (the "
        "same GPUs) and --max-num-seqs per rank is kept (docs/pd.md)",
    )
    add_expert_args(p)
    add_spec_args(p)
    g = p.add_argument_group("goodput and regime")
    add_slo_args(g)
    g.add_argument(
        "--regime-report",
        action="store_true",
        help="print each run's regime report (healthy or LOW: mixed rounds, windows per "
        "second, per-rank prefill progress; sim/regime_report.py); keeps every round, slower",
    )
    g = p.add_argument_group("output")
    g.add_argument("--max-rounds", type=int, default=None, help="stop after this many rounds")
    g.add_argument("--json", type=Path, default=None, help="write the metrics here")
    g.add_argument("--plot", type=Path, default=None, help="write PNG plots into this folder")
    g.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run, parser=p)


def simulate_with_progress(spec: SimSpec, progress: bool = False) -> SimResult:
    """One run, with a progress bar on a terminal."""
    if not (progress and sys.stderr.isatty()):
        return simulate(spec)
    from tqdm import tqdm

    arrivals = spec.workload if isinstance(spec.workload, tuple) else None
    total = None if arrivals is None else len(arrivals)
    done = [0]
    with tqdm(total=total, desc=spec.policy, unit="req", leave=False) as bar:

        def on_round(_rounds: int, finished: int) -> None:
            if finished != done[0]:
                bar.update(finished - done[0])
                done[0] = finished

        return simulate(spec, on_round)


def run_scenario(ns: argparse.Namespace) -> int:
    """``--scenario NAME``: every arm of a published measurement, with each figure's error."""
    if ns.scenario not in SCENARIOS and ns.scenario not in REGIMES:
        known = ", ".join([*SCENARIOS, *REGIMES])
        ns.parser.error(f"--scenario must be one of {known}, got {ns.scenario!r}")
    scenario = SCENARIOS.get(ns.scenario) or REGIMES[ns.scenario]
    overrides = {name: getattr(ns, name, None) for name in COST_FLAGS}
    costs = None
    # The cost flags override the scenario's own preset unless --costs names another (its
    # default, toy, is not a choice here: no scenario runs on the toy clock).
    base = scenario.costs if ns.costs == "toy" else ns.costs
    if base != scenario.costs or any(value is not None for value in overrides.values()):
        try:
            costs = resolve_costs(base, overrides)
        except ValueError as exc:
            ns.parser.error(str(exc))
    requests = ns.scenario_requests
    if requests is not None and requests < 10:
        ns.parser.error(f"--scenario-requests must be >= 10, got {requests}")
    if ns.scenario in REGIMES:
        try:
            return regime_cli.run(ns, costs, base)
        except ValueError as exc:
            ns.parser.error(str(exc))
    rows, summaries = replay(ns.scenario, costs, requests, seed=ns.seed)
    print(f"{ns.scenario}: {scenario.source}; costs {base}{' with overrides' if costs else ''}")
    print(f"published run: {scenario.published_stability}")
    length = f"{requests} requests (--scenario-requests)" if requests else scenario.run_length
    print(f"run length: {length}")
    for label, summary in summaries.items():
        print(f"{label}: {describe(summary['steady_state'])}")
    print(format_rows(rows))
    if ns.plot is not None:
        path = steady_state(
            {label: s["steady_state"] for label, s in summaries.items()},
            ns.plot / f"{ns.scenario}_steady.png",
            ns.scenario,
        )
        print(f"wrote {path}")
    if ns.json is not None:
        report = {
            "scenario": ns.scenario,
            "source": scenario.source,
            "published_stability": scenario.published_stability,
            "run_length": length,
            "figures": [
                {**asdict(r), "error": r.error, "within_tolerance": r.within, "verdict": r.verdict}
                for r in rows
            ],
            "results": summaries,
        }
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


def run(ns: argparse.Namespace) -> int:
    if getattr(ns, "scenario", None) is not None:
        try:
            refuse_expert_flags(vars(ns), "--scenario")
        except ValueError as exc:
            ns.parser.error(str(exc))
        return run_scenario(ns)
    split = None
    flags: dict[str, Any] = {}  # parsed flags the run replaces
    try:
        slo = slo_of(ns)
        if ns.disaggregate is not None:
            refuse_expert_flags(vars(ns), "--disaggregate")
            split = parse_split(ns.disaggregate)
            flags = disaggregated_flags(ns, split)
        # The regime report reads every round (the timeline), which the fast path skips.
        keep = {"keep_timeline": True} if getattr(ns, "regime_report", False) else {}
        specs = [replace(spec, itl_slo_ms=slo.itl_ms, **keep) for spec in sim_specs(ns, **flags)]
    except ValueError as exc:
        ns.parser.error(str(exc))
    results = [simulate_with_progress(spec, not ns.no_progress) for spec in specs]
    if split is not None:
        pd, sim = simulate_pd(specs[0], *split)
        results.append(pd)
        print(f"P/D {split[0]}:{split[1]}: {describe_transfers(sim)}")
    summaries = [summarize(r) for r in results]
    goodputs = {r.policy: goodput(r, slo) for r in results}
    baseline = "none" if len(summaries) > 1 else None
    print(format_table(summaries, baseline=baseline))
    print(format_goodputs(goodputs, baseline))
    for result in results:
        if result.experts is not None:
            print(describe_experts(result.policy, result.experts))
    regimes = {}
    if getattr(ns, "regime_report", False):
        chunk = specs[0].args.max_scheduled_tokens
        regimes = {r.policy: regime_report(r, chunk) for r in results if r.timeline is not None}
        print("regime:")
        print(format_reports(regimes))
    if ns.json is not None:
        report = {
            "config": _config(vars(ns) | flags, specs[0].costs),
            "results": summaries,
            "goodput": {name: g.as_dict() for name, g in goodputs.items()},
        }
        if regimes:
            report["regime"] = {name: r.as_dict() for name, r in regimes.items()}
        if baseline is not None:
            report["ratios_to_none"] = ratios_to(summaries, baseline)
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if ns.plot is not None:
        for path in write_plots(results, ns.plot, summaries):
            print(f"wrote {path}")
    return 0


def _config(given: dict[str, Any], costs: RoundCosts) -> dict:
    """The JSON report's ``config``: every flag, the lengths and costs as resolved."""
    cfg = {k: v for k, v in given.items() if k not in ("func", "parser")}
    lengths = (given["workload"], given["input_len"], given["output_len"], given["length_dist"])
    cfg |= resolve_lengths(*lengths)
    cfg = {k: str(v) if isinstance(v, Path) else v for k, v in cfg.items()}
    cfg["resolved_costs"] = {n: getattr(costs, n) for n in COST_FLAGS}
    return cfg
