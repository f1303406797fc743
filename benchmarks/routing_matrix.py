"""The routing matrix: workloads x routers x gate policies x load x dp, on the calibrated preset.

    PYTHONPATH=. .venv/bin/python benchmarks/routing_matrix.py \
        [--json docs/results/routing_matrix.json] [--dp 8,64] [--num-requests 200]

Workloads: chat and agentic (random prompts, as ``sim_matrix.py``; prefix caching off) and
chat-sessions and agentic-sessions (multi-turn, shared system prompt; caching on). Routers:
round-robin, least-loaded, cache-aware, kv-aware, gate-aware, and the oracle (kv-aware's
cost on the pools themselves, no lag: the hit-rate yardstick). Policies: roundgate and
roundgate-auto. Loads: light and heavy, rates and sessions scaled with dp (slots too). The
kv routers' channel: 1 round of lag, no loss (``--kv-event-loss`` to vary). It prints one
markdown table, the two targets of issue #26 cell by cell, and the channel's events/s.

Targets: kv-aware's prefix hit rate within 2 points of the oracle's and above cache-aware's
(session workloads); gate-aware + roundgate TTFT p50 <= 0.75 x round-robin + roundgate, with
ITL p50 and p99 <= 1.05 x (chat, agentic).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from roundgate.actors.server_args import ServerArgs
from roundgate.gate import registry
from roundgate.sim.kv_channel import ChannelSpec
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import RouterSpec
from roundgate.sim.sessions import SESSION_WORKLOADS, SessionSpec
from roundgate.sim.simulator import GroupSimulator
from roundgate.sim.spec import SimSpec, arrivals_of
from roundgate.sim.workload import WorkloadSpec

COSTS = "gb200-dsv3"
# Random-prompt workloads at dp=8 (as benchmarks/sim_matrix.py): (in, out, dist, light, heavy).
RANDOM = {
    "chat": (230, 200, "uniform", 8.0, 40.0),
    "agentic": (8596, 182, "uniform", 0.5, 2.0),
}
# Session workloads at dp=8: (sessions, light new sessions/s, heavy).
SESSIONS = {
    "chat-sessions": (64, 4.0, 16.0),
    "agentic-sessions": (32, 0.5, 2.0),
}
ROUTERS = ("round-robin", "least-loaded", "cache-aware", "kv-aware", "gate-aware", "oracle")
POLICIES = ("roundgate", "roundgate-auto")


def group_args(dp: int, policy: str, caching: bool) -> ServerArgs:
    return ServerArgs(
        dp_size=dp,
        max_num_seqs=1024 * dp,
        max_scheduled_tokens=8192,
        page_size=64,
        num_kv_pages=8192 if not caching else 4096,
        enable_mixed_prefill_decode=True,
        enable_prefix_caching=caching,
        prefill_policy=policy,
        **registry.comparison_flags(policy, {}),
    )


def workload_of(name: str, load: str, dp: int, num_requests: int, vocab: int):
    scale = dp / 8
    if name in RANDOM:
        inp, out, dist, light, heavy = RANDOM[name]
        rate = (light if load == "light" else heavy) * scale
        n = int(max(40, num_requests * 200 // max(200, out)) * scale)
        return WorkloadSpec(
            num_requests=n, rate=rate, input_len=inp, output_len=out, length_dist=dist, seed=0
        ), rate
    sessions, light, heavy = SESSIONS[name]
    rate = (light if load == "light" else heavy) * scale
    spec = SessionSpec(
        SESSION_WORKLOADS[name], num_sessions=int(sessions * scale), rate=rate, vocab_size=vocab
    )
    return spec, rate


def run(
    name: str, router: str, policy: str, load: str, dp: int, num_requests: int, channel
) -> dict:
    args = group_args(dp, policy, caching=name in SESSIONS)
    workload, rate = workload_of(name, load, dp, num_requests, args.model_config.vocab_size)
    kv_channel = channel if router in ("kv-aware", "gate-aware") else None
    spec = SimSpec(args, workload, PRESETS[COSTS], RouterSpec(router, channel=kv_channel))
    arrivals = arrivals_of(spec)
    sim = GroupSimulator(
        args, spec.costs, spec.router.build(dp, 0, args.page_size), policy, keep_timeline=False
    )
    started = time.perf_counter()
    result = sim.run(arrivals)
    wall = time.perf_counter() - started
    s = summarize(result)
    row = {
        "workload": name,
        "router": router,
        "policy": policy,
        "load": load,
        "dp": dp,
        "rate": rate,
        "requests": len(result.records),
        "output_tokens_per_s": s["output_tokens_per_s"],
        "ttft_p50": s["ttft_ms"]["p50"],
        "ttft_p99": s["ttft_ms"]["p99"],
        "itl_p50": s["itl_ms"]["p50"],
        "itl_p99": s["itl_ms"]["p99"],
        "hit_rate": s["prefix_hit_rate"],
        "decode_frac": s["decode_round_fraction"],
        "unfinished": s["unfinished"],
        "wall_s": round(wall, 2),
    }
    if sim.channel is not None:
        c = sim.channel
        row["channel"] = {
            "events_per_sim_s": c.num_events / max(result.duration_s, 1e-9),
            "batches_per_sim_s": c.num_batches / max(result.duration_s, 1e-9),
            "lost": c.num_lost,
            "resyncs": sim.router.kv.index.num_resyncs,
            "lag_rounds": c.spec.lag_rounds,
        }
    return row


def find(rows: list[dict], **match) -> dict:
    return next(r for r in rows if all(r[k] == v for k, v in match.items()))


def targets(rows: list[dict], dps: list[int]) -> list[str]:
    """Every target cell, met or MISS, one line each."""
    lines = []
    for dp in dps:
        for name in SESSIONS:
            for policy in POLICIES:
                for load in ("light", "heavy"):
                    cell = {"workload": name, "policy": policy, "load": load, "dp": dp}
                    kv = find(rows, router="kv-aware", **cell)["hit_rate"]
                    oracle = find(rows, router="oracle", **cell)["hit_rate"]
                    cache = find(rows, router="cache-aware", **cell)["hit_rate"]
                    ok = kv >= oracle - 0.02 and kv > cache
                    lines.append(
                        f"{'ok  ' if ok else 'MISS'} hit rate {name} {policy} {load} dp={dp}: "
                        f"kv-aware {kv:.3f}, oracle {oracle:.3f}, cache-aware {cache:.3f}"
                    )
        for name in RANDOM:
            for load in ("light", "heavy"):
                cell = {"workload": name, "policy": "roundgate", "load": load, "dp": dp}
                gate = find(rows, router="gate-aware", **cell)
                rr = find(rows, router="round-robin", **cell)
                ttft = gate["ttft_p50"] / rr["ttft_p50"]
                itl50 = gate["itl_p50"] / rr["itl_p50"]
                itl99 = gate["itl_p99"] / rr["itl_p99"]
                ok = ttft <= 0.75 and itl50 <= 1.05 and itl99 <= 1.05
                lines.append(
                    f"{'ok  ' if ok else 'MISS'} gate-aware/round-robin {name} {load} dp={dp}: "
                    f"TTFT p50 {ttft:.2f}x ({gate['ttft_p50']:.0f} vs {rr['ttft_p50']:.0f} ms), "
                    f"ITL p50 {itl50:.3f}x, ITL p99 {itl99:.3f}x"
                )
    return lines


def markdown(rows: list[dict]) -> str:
    lines = [
        "| workload | load | dp | policy | router | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | "
        "ITL p99 | hit rate | decode frac |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['load']} | {r['dp']} | {r['policy']} | {r['router']} | "
            f"{r['output_tokens_per_s']:,.0f} | {r['ttft_p50']:,.0f} | {r['ttft_p99']:,.0f} | "
            f"{r['itl_p50']:.1f} | {r['itl_p99']:.1f} | {r['hit_rate']:.3f} | "
            f"{r['decode_frac']:.3f} |"
        )
    return "\n".join(lines)


def docs_tables(rows: list[dict]) -> str:
    """The docs' two tables (docs/routing.md): hit rate per router on the session workloads,
    and TTFT p50 / ITL p50 / ITL p99 per router under roundgate on chat and agentic."""
    routers = [r for r in ROUTERS if any(row["router"] == r for row in rows)]
    out = [
        "| workload | load | dp | policy | " + " | ".join(routers) + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in routers) + " |",
    ]
    cells = sorted(
        {
            (r["workload"], r["load"], r["dp"], r["policy"])
            for r in rows
            if r["workload"] in SESSIONS
        },
        key=lambda c: (c[2], c[0], c[1] != "light", c[3]),
    )
    for name, load, dp, policy in cells:
        cell = {"workload": name, "load": load, "dp": dp, "policy": policy}
        hits = [f"{find(rows, router=r, **cell)['hit_rate']:.3f}" for r in routers]
        out.append(f"| {name} | {load} | {dp} | {policy} | " + " | ".join(hits) + " |")
    out += [
        "",
        "| workload | load | dp | " + " | ".join(routers) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in routers) + " |",
    ]
    cells = sorted(
        {(r["workload"], r["load"], r["dp"]) for r in rows if r["workload"] in RANDOM},
        key=lambda c: (c[2], c[0], c[1] != "light"),
    )
    for name, load, dp in cells:
        cell = {"workload": name, "load": load, "dp": dp, "policy": "roundgate"}
        figures = []
        for r in routers:
            row = find(rows, router=r, **cell)
            figures.append(f"{row['ttft_p50']:,.0f} / {row['itl_p50']:.1f} / {row['itl_p99']:.0f}")
        out.append(f"| {name} | {load} | {dp} | " + " | ".join(figures) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--dp", default="8,64")
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--workloads", default=",".join([*RANDOM, *SESSIONS]))
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--kv-event-lag-rounds", type=int, default=1)
    parser.add_argument("--kv-event-loss", type=float, default=0.0)
    parser.add_argument(
        "--table-from", type=Path, default=None, help="print the docs' tables of a JSON, stop"
    )
    ns = parser.parse_args()
    if ns.table_from is not None:
        rows = json.loads(ns.table_from.read_text())["rows"]
        print(docs_tables(rows))
        print("\n".join(targets(rows, sorted({r["dp"] for r in rows}))))
        return
    channel = ChannelSpec(lag_rounds=ns.kv_event_lag_rounds, loss_rate=ns.kv_event_loss)
    dps = [int(d) for d in ns.dp.split(",")]
    rows = []
    for dp in dps:
        for name in ns.workloads.split(","):
            for load in ("light", "heavy"):
                for policy in POLICIES:
                    for router in ns.routers.split(","):
                        row = run(name, router, policy, load, dp, ns.num_requests, channel)
                        rows.append(row)
                        print(
                            f"done {name} {load} dp={dp} {policy} {router} ({row['wall_s']} s)",
                            flush=True,
                        )
    print(markdown(rows))
    try:
        print("\n".join(targets(rows, dps)))
    except StopIteration:
        print("(targets need every router and workload)")
    channels = [r["channel"] for r in rows if "channel" in r]
    if channels:
        eps = sorted(c["events_per_sim_s"] for c in channels)
        print(f"channel: events/s (simulated) median {eps[len(eps) // 2]:,.0f}, max {eps[-1]:,.0f}")
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"costs": COSTS, "channel": asdict(channel)}
        ns.json.write_text(json.dumps({**meta, "rows": rows}, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
