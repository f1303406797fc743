"""``roundgate simulate``: the group simulator's command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from actors.server_args import ServerArgs
from deployment.sim.report import format_table, summarize, write_plots
from deployment.sim.simulator import GroupSimulator, SimResult
from deployment.sim.workload import ARRIVALS, LENGTH_DISTS, ROUTERS, Router, WorkloadSpec, generate
from gate.round_costs import PRESETS, RoundCosts, load_costs

POLICIES = ("roundgate", "none", "local-interval")
COST_FLAGS = (
    "decode_base_ms",
    "decode_per_seq_ms",
    "prefill_per_token_ms",
    "extend_overhead_ms",
    "gather_ms",
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="run the real control plane for N ranks on a simulated cost clock",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("group")
    g.add_argument("--dp-size", type=int, default=8)
    g.add_argument("--max-num-seqs", type=int, default=1024, help="running requests, whole group")
    g.add_argument("--max-scheduled-tokens", type=int, default=8192)
    g.add_argument("--page-size", type=int, default=64)
    g.add_argument("--num-kv-pages", type=int, default=4096, help="per rank")
    g.add_argument("--enable-mixed-prefill-decode", action="store_true")
    g = p.add_argument_group("policy")
    g.add_argument("--policy", default="roundgate", help=f"one of {', '.join(POLICIES)}")
    g.add_argument("--compare", default=None, help="comma-separated policies, or 'all'")
    g.add_argument("--prefill-attempt-interval", type=int, default=4)
    g.add_argument("--prefill-any-attempt-interval", type=int, default=16)
    g.add_argument("--prefill-decode-interval", type=int, default=4, help="local-interval only")
    g = p.add_argument_group("costs (ms)")
    g.add_argument("--costs", default="toy", help=f"preset ({', '.join(PRESETS)}) or FILE.json")
    for name in COST_FLAGS:
        g.add_argument(
            "--" + name.replace("_", "-"), type=float, default=None, help="override the preset"
        )
    g = p.add_argument_group("workload")
    g.add_argument("--num-requests", type=int, default=500)
    g.add_argument("--arrival", default="poisson", choices=ARRIVALS)
    g.add_argument("--rate", type=float, default=20.0, help="requests/s")
    g.add_argument("--burst-size", type=int, default=8)
    g.add_argument("--input-len", type=int, default=1000)
    g.add_argument("--output-len", type=int, default=200)
    g.add_argument("--length-dist", default="fixed", choices=LENGTH_DISTS)
    g.add_argument("--trace", default=None, help="JSONL arrivals (with --arrival trace)")
    g.add_argument("--router", default="round-robin", choices=ROUTERS)
    g.add_argument("--route-weights", default=None, help="e.g. 8,1,1,1 (skewed router)")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("output")
    g.add_argument("--max-rounds", type=int, default=None, help="stop after this many rounds")
    g.add_argument("--json", type=Path, default=None, help="write the metrics here")
    g.add_argument("--plot", type=Path, default=None, help="write PNG plots into this folder")
    g.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run, parser=p)


def _costs(ns: argparse.Namespace) -> RoundCosts:
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
    overrides = {n: getattr(ns, n) for n in COST_FLAGS if getattr(ns, n) is not None}
    for name, value in overrides.items():
        if not value >= 0:  # also refuses NaN
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
    if overrides:
        values = {n: getattr(costs, n) for n in COST_FLAGS} | overrides
        costs = RoundCosts(**values)
    return costs


def _policies(ns: argparse.Namespace) -> list[str]:
    names = (
        [ns.policy]
        if ns.compare is None
        else (list(POLICIES) if ns.compare == "all" else [s.strip() for s in ns.compare.split(",")])
    )
    for name in names:
        if name not in POLICIES:
            flag = "--policy" if ns.compare is None else "--compare"
            raise ValueError(f"{flag}: unknown policy {name!r} (policies: {', '.join(POLICIES)})")
    return names


def server_args_for(ns: argparse.Namespace, policy: str) -> ServerArgs:
    """The engine flags one policy runs with; the rest of the group config is shared."""
    gate_on = policy == "roundgate"
    return ServerArgs(
        dp_size=ns.dp_size,
        max_num_seqs=ns.max_num_seqs,
        max_scheduled_tokens=ns.max_scheduled_tokens,
        page_size=ns.page_size,
        num_kv_pages=ns.num_kv_pages,
        enable_mixed_prefill_decode=ns.enable_mixed_prefill_decode,
        prefill_attempt_interval=ns.prefill_attempt_interval if gate_on else None,
        prefill_any_attempt_interval=ns.prefill_any_attempt_interval if gate_on else None,
        prefill_decode_interval=ns.prefill_decode_interval if policy == "local-interval" else 0,
    ).validate()


def _weights(ns: argparse.Namespace) -> list[int] | None:
    if ns.route_weights is None:
        return None
    try:
        return [int(w) for w in ns.route_weights.split(",")]
    except ValueError:
        raise ValueError(
            f"--route-weights: expected integers like 8,1,1,1, got {ns.route_weights!r}"
        ) from None


def prepare(ns: argparse.Namespace):
    """Validate every flag up front; returns (policies, args per policy, costs, spec, weights)."""
    policies = _policies(ns)
    costs = _costs(ns)
    spec = WorkloadSpec(
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
    weights = _weights(ns)
    Router(ns.router, ns.dp_size, weights, ns.seed)  # validates router flags
    args = {p: server_args_for(ns, p) for p in policies}
    if ns.max_rounds is not None and ns.max_rounds < 1:
        raise ValueError(f"--max-rounds must be >= 1, got {ns.max_rounds}")
    return policies, args, costs, spec, weights


def check_arrivals(arrivals: list, args: ServerArgs, ns: argparse.Namespace) -> None:
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


def run(ns: argparse.Namespace) -> int:
    try:
        policies, args, costs, spec, weights = prepare(ns)
        arrivals = generate(spec)
        check_arrivals(arrivals, args[policies[0]], ns)
    except ValueError as exc:
        ns.parser.error(str(exc))
    results: list[SimResult] = []
    for policy in policies:
        sim = GroupSimulator(
            args[policy],
            costs,
            Router(ns.router, ns.dp_size, weights, ns.seed),
            policy,
            keep_timeline=ns.plot is not None,
        )
        bar = None
        if not ns.no_progress and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=len(arrivals), desc=policy, unit="req", leave=False)
        done = [0]

        def on_round(_rounds: int, finished: int, bar=bar, done=done) -> None:
            if bar is not None and finished != done[0]:
                bar.update(finished - done[0])
                done[0] = finished

        results.append(sim.run(arrivals, ns.max_rounds, on_round if bar else None))
        if bar is not None:
            bar.close()
    summaries = [summarize(r) for r in results]
    print(format_table(summaries, baseline="none" if len(summaries) > 1 else None))
    if ns.json is not None:
        report = {"config": _config(ns, costs), "results": summaries}
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if ns.plot is not None:
        for path in write_plots(results, ns.plot):
            print(f"wrote {path}")
    return 0


def _config(ns: argparse.Namespace, costs: RoundCosts) -> dict:
    cfg = {k: v for k, v in vars(ns).items() if k not in ("func", "parser")}
    cfg = {k: str(v) if isinstance(v, Path) else v for k, v in cfg.items()}
    cfg["resolved_costs"] = {n: getattr(costs, n) for n in COST_FLAGS}
    return cfg
