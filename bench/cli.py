"""``roundgate bench``: load a live deployment over its OpenAI API and report what clients saw.

Against a running server (``--url``), or with ``--compare POLICY,...`` it starts the local
deployment itself (a Ray cluster on loopback) and redeploys it once per prefill policy, running
the same seeded workload against each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from roundgate.bench.client import RequestResult, run_load
from roundgate.bench.report import format_table, summarize, write_plots
from roundgate.bench.sessions import (
    hit_counters,
    hit_rate,
    run_sessions,
    scrape_metrics,
    scrape_settled,
)
from roundgate.deployment.local import DEFAULT_CONFIG
from roundgate.gate import registry
from roundgate.routing import registry as routers
from roundgate.sim.arrivals import Arrival
from roundgate.sim.sessions import SESSION_WORKLOADS, Session, SessionSpec, make_sessions
from roundgate.sim.workload import ARRIVALS, LENGTH_DISTS, WorkloadSpec, generate

LENGTH_PRESETS = {"short": (32, 32), "chat": (230, 200), "long-prompt": (900, 32)}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark a live deployment over its OpenAI API",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name (default: the server's first)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--arrival", default="poisson", choices=[a for a in ARRIVALS])
    p.add_argument("--rate", type=float, default=4.0, help="requests/s (open loop)")
    p.add_argument("--burst-size", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=None, help="closed loop instead of rate")
    p.add_argument(
        "--lengths",
        default="short",
        choices=sorted(LENGTH_PRESETS),
        help="prompt/output length preset (overridden by --input-len/--output-len)",
    )
    p.add_argument("--input-len", type=int, default=None)
    p.add_argument("--output-len", type=int, default=None)
    p.add_argument("--length-dist", default="uniform", choices=LENGTH_DISTS)
    p.add_argument(
        "--trace", default=None, help="JSONL arrivals (time_s, prompt_tokens, output_tokens, rank?)"
    )
    p.add_argument(
        "--pin-weights",
        default=None,
        help="pin requests to dp ranks with these weights, e.g. 8,1 (skewed routing)",
    )
    g = p.add_argument_group("sessions (multi-turn, shared prefixes)")
    g.add_argument("--sessions", default=None, choices=sorted(SESSION_WORKLOADS))
    g.add_argument("--num-sessions", type=int, default=8, help="--rate: new sessions/s")
    for name in ("system_len", "first_user_len", "user_len", "turns"):
        g.add_argument("--" + name.replace("_", "-"), type=int, default=None, help="override")
    g.add_argument("--think-s", type=float, default=None, help="override the mean think time")
    p.add_argument(
        "--compare-prefix-caching",
        action="store_true",
        help="restart the local deployment with prefix caching on, then off",
    )
    p.add_argument(
        "--deploy-router",
        default=None,
        choices=routers.names("serve"),
        help="router of the local deployment",
    )
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-itl-ms", type=float, default=200.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compare",
        default=None,
        help=f"restart the local deployment per policy: {','.join(registry.names())}",
    )
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="for --compare")
    p.add_argument(
        "--pd-config",
        type=Path,
        default=None,
        help="with --compare: also run this P/D config (e.g. deployment/configs/pd.yaml) as "
        "arm 'pd'",
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument(
        "--metrics-dir",
        type=Path,
        default=None,
        help="save the deployment's /metrics before and after each load (LABEL.before.prom, "
        "LABEL.after.prom) for roundgate calibrate",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run, parser=p)


def session_workload(ns: argparse.Namespace) -> list[Session]:
    """``--sessions``: the preset with its overrides (``--output-len`` sets the answers)."""
    fields = ("system_len", "first_user_len", "user_len", "turns", "think_s")
    changes = {f: getattr(ns, f) for f in fields if getattr(ns, f) is not None}
    if ns.output_len is not None:
        changes["output_len"] = ns.output_len
    for name, value in changes.items():
        if not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
    preset = replace(SESSION_WORKLOADS[ns.sessions], **changes)
    spec = SessionSpec(preset, ns.num_sessions, ns.rate, vocab_size=256, seed=ns.seed)
    return make_sessions(spec)


def workload(ns: argparse.Namespace) -> list[Arrival]:
    inp, out = LENGTH_PRESETS[ns.lengths]
    spec = WorkloadSpec(
        num_requests=ns.num_requests,
        arrival="trace" if ns.trace else ns.arrival,
        rate=ns.rate,
        burst_size=ns.burst_size,
        input_len=ns.input_len or inp,
        output_len=ns.output_len or out,
        length_dist=ns.length_dist,
        trace=ns.trace,
        seed=ns.seed,
    )
    arrivals = generate(spec)
    if ns.pin_weights:
        import random

        try:
            weights = [int(w) for w in ns.pin_weights.split(",")]
        except ValueError:
            raise ValueError(
                f"--pin-weights: expected integers like 8,1, got {ns.pin_weights!r}"
            ) from None
        if any(w < 0 for w in weights) or sum(weights) == 0:
            raise ValueError("--pin-weights must be >= 0 with a positive sum")
        rng = random.Random(ns.seed + 1)
        ranks = rng.choices(range(len(weights)), weights=weights, k=len(arrivals))
        arrivals = [
            Arrival(a.time_s, a.prompt_tokens, a.output_tokens, r)
            for a, r in zip(arrivals, ranks, strict=True)
        ]
    return arrivals


def policy_overrides(policy: str, base: dict[str, Any]) -> dict[str, Any]:
    """Engine args that select ``policy`` on top of a config's args: every other policy's
    flags unset, its own from the config or else simulate's defaults."""
    if policy not in registry.names():
        names = ", ".join(registry.names())
        raise ValueError(f"--compare: unknown policy {policy!r} (policies: {names})")
    unset: dict[str, Any] = dict.fromkeys(registry.all_flags())
    return {**unset, **registry.comparison_flags(policy, base), "prefill_policy": policy}


def _load(
    url: str, model: str | None, arrivals: list[Arrival], ns: argparse.Namespace, label: str
) -> tuple[list[RequestResult], float]:
    import httpx

    if model is None:
        headers = {"Authorization": f"Bearer {ns.api_key}"} if ns.api_key else {}
        model = httpx.get(f"{url}/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
    bar = None
    if not ns.no_progress:
        from tqdm import tqdm

        total = sum(s.num_turns for s in arrivals) if ns.sessions else len(arrivals)
        bar = tqdm(total=total, desc=label, unit="req", file=sys.stderr)
    on_done = (lambda _r: bar.update(1)) if bar else None
    before = scrape_metrics(url, ns.api_key)
    if ns.sessions:
        load = run_sessions(url, model, arrivals, ns.api_key, on_done)
    else:
        load = run_load(url, model, arrivals, ns.concurrency, ns.seed, ns.api_key, on_done)
    results, duration = asyncio.run(load)
    if bar:
        bar.close()
    after = scrape_settled(url, ns.api_key)
    ns.hit_rates[label] = hit_rate(hit_counters(before), hit_counters(after))
    if ns.metrics_dir is not None:
        # Both scrapes: ``roundgate calibrate --metrics AFTER --metrics-baseline BEFORE`` prices
        # exactly the rounds this load ran.
        ns.metrics_dir.mkdir(parents=True, exist_ok=True)
        for stage, text in (("before", before), ("after", after)):
            if text is not None:
                (ns.metrics_dir / f"{label}.{stage}.prom").write_text(text)
    return results, duration


def _summary(ns: argparse.Namespace, label: str, results: list, duration: float) -> dict:
    summary = summarize(results, duration, ns.slo_ttft_ms, ns.slo_itl_ms)
    return {**summary, "prefix_hit_rate": ns.hit_rates.get(label)}


def run(ns: argparse.Namespace) -> int:
    ns.hit_rates = {}
    try:
        arrivals = session_workload(ns) if ns.sessions else workload(ns)
        policies = [s.strip() for s in ns.compare.split(",")] if ns.compare else []
        if ns.compare or ns.compare_prefix_caching:
            from roundgate.deployment.local import load_config

            cfg = load_config(ns.config)
            base = cfg["applications"][0]["args"]
            overrides = {p: policy_overrides(p, base) for p in policies}
            if ns.compare_prefix_caching:
                overrides = {
                    "prefix-caching": {"enable_prefix_caching": True},
                    "no-prefix-caching": {"enable_prefix_caching": False},
                }
            if ns.deploy_router:
                overrides = {n: {**o, "router": ns.deploy_router} for n, o in overrides.items()}
    except ValueError as exc:
        ns.parser.error(str(exc))
    named: list[tuple[str, dict[str, Any], list[RequestResult]]] = []
    if not overrides_given(ns):
        results, duration = _load(ns.url, ns.model, arrivals, ns, "bench")
        named.append(("bench", _summary(ns, "bench", results, duration), results))
        configs = {"bench": {"url": ns.url}}
    else:
        named, configs = _compare(ns, cfg, overrides, arrivals)
    print(format_table([(n, s) for n, s, _ in named]))
    if ns.json:
        report = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": [recorded_path(Path(sys.argv[0])), *sys.argv[1:]],
            "workload": _args(ns),
            "configs": configs,
            "results": {n: s for n, s, _ in named},
        }
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if ns.plot:
        for path in write_plots([(n, r) for n, _, r in named], ns.plot):
            print(f"wrote {path}")
    failed = sum(s["requests"] - s["completed"] for _, s, _ in named)
    return 1 if failed and failed == sum(s["requests"] for _, s, _ in named) else 0


def _compare(
    ns: argparse.Namespace, cfg: dict[str, Any], overrides: dict[str, dict], arrivals: list[Arrival]
):
    from roundgate.deployment.local import config_url, each_deployment, load_config

    url = config_url(cfg)
    named, configs = [], {}

    def run(policy: str) -> None:
        results, duration = _load(url, None, arrivals, ns, policy)
        named.append((policy, _summary(ns, policy, results, duration), results))
        if policy in overrides:
            configs[policy] = {**cfg["applications"][0]["args"], **overrides[policy]}

    extra = {} if ns.pd_config is None else {"pd": load_config(ns.pd_config)}
    each_deployment(cfg, overrides, run, extra)
    for label, other in extra.items():
        configs[label] = other["applications"][0]["args"]
    return named, configs


def overrides_given(ns: argparse.Namespace) -> bool:
    """Whether bench starts and redeploys the local deployment itself."""
    return bool(ns.compare or ns.compare_prefix_caching)


def _args(ns: argparse.Namespace) -> dict[str, Any]:
    return {
        k: recorded_path(v) if isinstance(v, Path) else v
        for k, v in vars(ns).items()
        if k not in ("func", "parser", "api_key", "hit_rates")
    }


def recorded_path(path: Path) -> str:
    """``path`` as a report records it: relative to the checkout when it lies inside it (the
    default ``--config`` is absolute), so a committed report names no one machine's folders."""
    repo, full = Path(__file__).resolve().parents[1], path.resolve()
    return str(full.relative_to(repo)) if full.is_relative_to(repo) else str(path)
