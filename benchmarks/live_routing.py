"""Live routing comparison on this machine: dp=2, the real default model, under the gate.

    PYTHONPATH=. .venv/bin/python benchmarks/live_routing.py [--json docs/results/live_routing.json]
        [--repeats 1] [--num-sessions 8] [--num-requests 40]

Starts the local deployment (``deployment/configs/local.yaml``: SmolLM2-135M, one group of two
ranks, the group gate) and redeploys it once per arm; each arm runs its workload ``--repeats``
times and reports the medians:

- multi-turn chat sessions (``chat-sessions`` shortened to fit two CPU cores), prefix caching
  on: ``cache-aware`` (today's, guessing from what it sent) vs ``kv-aware`` (on the ranks'
  events): prefix hit rate (the ranks' own counters) and TTFT p50;
- a random-prompt open-loop load: ``round-robin`` vs ``gate-aware``: TTFT p50 and ITL.

For the kv arms it also reads the hub's events/s and its send-to-hub lag. With a P/D
``--config`` (a ``prefill:`` and a ``decode:`` section) the session arms compare the P/D
routers instead (``cache-aware``: the ingress's guess; ``kv-aware``: the ranks' reports, both
roles), the hit rate read from the prefill ranks; the random-prompt arms are fused-only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from roundgate.bench.cli import recorded_path
from roundgate.bench.client import run_load
from roundgate.bench.report import summarize
from roundgate.bench.sessions import run_sessions
from roundgate.deployment.local import DEFAULT_CONFIG, config_url, each_deployment, load_config
from roundgate.sim.sessions import SESSION_WORKLOADS, SessionSpec, make_sessions
from roundgate.sim.workload import WorkloadSpec, generate

SESSIONS = replace(
    SESSION_WORKLOADS["chat-sessions"],
    system_len=200,
    first_user_len=40,
    user_len=30,
    output_len=16,
    turns=4,
    think_s=0.5,
)
ARMS = {
    "cache-aware": ("sessions", {"router": "cache-aware", "enable_prefix_caching": True}),
    "kv-aware": ("sessions", {"router": "kv-aware", "enable_prefix_caching": True}),
    "round-robin": ("random", {"router": "round-robin", "enable_prefix_caching": False}),
    "gate-aware": ("random", {"router": "gate-aware", "enable_prefix_caching": False}),
}


def hub_stats() -> dict[str, float] | None:
    import ray

    from roundgate.actors.control.kv_events import HUB_NAME, HUB_NAMESPACE

    try:
        hub = ray.get_actor(HUB_NAME, namespace=HUB_NAMESPACE)
    except ValueError:
        return None
    return ray.get(hub.stats_dict.remote(), timeout=30)


def counted_ranks(cfg: dict[str, Any]) -> tuple[str, int]:
    """The deployment whose ranks take the prompts (so count prefix hits), and how many: a
    P/D config's prefill role, else the fused groups' ranks."""
    args = cfg["applications"][0]["args"]
    if "prefill" in args:
        return "PrefillRank", int(args["prefill"].get("dp_size", 1))
    return "RankReplica", int(args.get("dp_size", 1)) * int(args.get("num_groups", 1))


def rank_counters(ranks_of: tuple[str, int] = ("RankReplica", 2)) -> tuple[int, int]:
    """Prefix-cache (queries, hits) in tokens, summed over the ranks (their own counters:
    the metrics endpoint's series can outlive a redeploy)."""
    from ray import serve

    from roundgate.actors.control.messages import RankTarget

    deployment, num_ranks = ranks_of
    ranks = serve.get_deployment_handle(deployment, app_name="roundgate")
    stats = [
        ranks.stats_snapshot.remote(RankTarget(r)).result(timeout_s=60) for r in range(num_ranks)
    ]
    return sum(s["prefix_queries"] for s in stats), sum(s["prefix_hits"] for s in stats)


def one_run(
    url: str, model: str, kind: str, ns: argparse.Namespace, seed: int, ranks_of: tuple[str, int]
) -> dict[str, Any]:
    before = rank_counters(ranks_of)
    if kind == "sessions":
        spec = SessionSpec(SESSIONS, ns.num_sessions, ns.session_rate, vocab_size=256, seed=seed)
        load = run_sessions(url, model, make_sessions(spec), timeout_s=600)
    else:
        spec = WorkloadSpec(
            num_requests=ns.num_requests,
            rate=ns.rate,
            input_len=ns.input_len,
            output_len=ns.output_len,
            length_dist="uniform",
            seed=seed,
        )
        load = run_load(url, model, list(generate(spec)), None, seed, timeout_s=600)
    results, duration = asyncio.run(load)
    summary = summarize(results, duration, 1e9, 1e9)
    return {
        "completed": summary["completed"],
        "requests": summary["requests"],
        "ttft_p50": summary["ttft_ms"]["p50"],
        "ttft_p99": summary["ttft_ms"]["p99"],
        "itl_p50": summary["itl_ms"]["p50"],
        "itl_p99": summary["itl_ms"]["p99"],
        "hit_rate": hit_rate_between(before, rank_counters(ranks_of)),
    }


def hit_rate_between(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    queries, hits = after[0] - before[0], after[1] - before[1]
    return round(hits / queries, 4) if queries > 0 else None


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--num-sessions", type=int, default=8)
    parser.add_argument("--session-rate", type=float, default=1.0, help="new sessions/s")
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=2.0, help="random prompts/s")
    parser.add_argument("--input-len", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=32)
    ns = parser.parse_args()
    cfg = load_config(ns.config)
    model = cfg["applications"][0]["args"]["model"]
    url = config_url(cfg)
    arms = {name: ARMS[name] for name in ns.arms.split(",")}
    ranks_of = counted_ranks(cfg)
    report: dict[str, Any] = {}

    def run(label: str) -> None:
        kind = arms[label][0]
        runs = [one_run(url, model, kind, ns, seed, ranks_of) for seed in range(ns.repeats)]
        report[label] = {
            "workload": kind,
            "runs": runs,
            "hub": hub_stats() if label in ("kv-aware", "gate-aware") else None,
            **{k: median_of(runs, k) for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")},
            "hit_rate": median_of(runs, "hit_rate"),
        }
        print(label, json.dumps(report[label], sort_keys=True), flush=True)

    each_deployment(cfg, {name: extra for name, (_, extra) in arms.items()}, run)
    for name, r in report.items():
        hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.3f}"
        print(
            f"{name:12s} {r['workload']:8s} TTFT p50 {r['ttft_p50']:8.1f} ms  "
            f"ITL p50 {r['itl_p50']:6.1f}  p99 {r['itl_p99']:7.1f}  hit {hit}"
        )
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "args": vars(ns)}
        meta["args"] = {
            k: recorded_path(v) if isinstance(v, Path) else str(v) for k, v in meta["args"].items()
        }
        ns.json.write_text(json.dumps({**meta, "arms": report}, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
