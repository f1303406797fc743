"""Per-round time breakdown of a dp=2 group on CPU with the tiny MoE preset.

    .venv/bin/python benchmarks/bench_round_breakdown.py [--rounds 400] [--requests 16]

Two processes join a gloo group on 127.0.0.1, exactly as two rank replicas do (the same
EngineCore, TorchGather and ModelRunner with expert-parallel MoE over the group), and run a
steady workload. Every part of the round is timed by wrapping it: vote, plan, probe (the
published one), all-gather, observe, forward, update and token streaming (the event callback).
The bare gloo all-gather of the same row is timed in the same run for reference; the target is
that control-plane work other than the collective stays <= 50% of it. The Prometheus
recording of each round (``RankMetrics.observe``) is timed too: metrics on vs off is the round
time with and without it (target <= 3%).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from common import join_pair, run_pair

CONTROL = ("vote", "plan", "probe", "observe", "update", "stream")


def timed(store: dict[str, list[float]], name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            store[name].append(time.perf_counter() - t)

    return wrapper


def worker(rank: int, port: int, ns: argparse.Namespace, out: Any) -> None:
    join_pair(rank, port)
    from roundgate.actors.control.engine_core import EngineCore
    from roundgate.actors.control.request import Request, SamplingParams
    from roundgate.actors.model.runner import ModelRunner
    from roundgate.actors.replica.torch_gather import TorchGather
    from roundgate.actors.server_args import ServerArgs

    args = ServerArgs(
        model="tiny-moe",
        dp_size=2,
        max_num_seqs=64,
        max_scheduled_tokens=512,
        num_kv_pages=512,
        prefill_attempt_interval=4,
        prefill_any_attempt_interval=16,
        device="cpu",
    )
    times: dict[str, list[float]] = defaultdict(list)
    sink: list[Any] = []
    runner = ModelRunner(args, rank=rank, group=dist.group.WORLD)
    core = EngineCore(
        args,
        runner,
        rank=rank,
        gather=TorchGather(),
        on_event=sink.append,
    )
    loop, sched = core.loop, core.scheduler
    loop.policy.vote = timed(times, "vote", loop.policy.vote)
    loop.policy.observe = timed(times, "observe", loop.policy.observe)
    sched.plan = timed(times, "plan", sched.plan)
    sched.publish_probe = timed(times, "probe", sched.publish_probe)
    sched.update = timed(times, "update", sched.update)
    loop.gather.all_gather = timed(times, "all_gather", loop.gather.all_gather)
    loop.executor.execute = timed(times, "forward", loop.executor.execute)
    core.on_event = timed(times, "stream", sink.append)
    from roundgate.actors.telemetry.rank_metrics import RankMetrics

    metrics = RankMetrics("bench", "tiny-moe", rank)
    gen = torch.Generator().manual_seed(rank)
    n = 0
    for i in range(ns.rounds + ns.warmup):
        if i == ns.warmup:
            times.clear()
        while core.num_unfinished < ns.requests:
            length = int(torch.randint(8, 64, (1,), generator=gen))
            core.submit(
                Request(
                    f"r{rank}-{n}",
                    [1 + (n % 200)] * length,
                    SamplingParams(max_tokens=int(ns.max_tokens)),
                )
            )
            n += 1
        t = time.perf_counter()
        outcome = core.step()
        t_round = time.perf_counter() - t
        t = time.perf_counter()
        metrics.observe(outcome, sched, loop.parts, loop.policy.rounds_since_prefill)
        times["metrics"].append(time.perf_counter() - t)
        times["round"].append(t_round)
    # Bare all-gather of one packed row, same group, same run.
    row = torch.zeros(5, dtype=torch.int64)
    outs = [torch.empty_like(row) for _ in range(2)]
    for _ in range(ns.rounds):
        t = time.perf_counter()
        dist.all_gather(outs, row)
        times["bare_all_gather"].append(time.perf_counter() - t)
    out.put((rank, dict(times)))
    dist.destroy_process_group()


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--requests", type=int, default=16, help="unfinished requests kept per rank")
    p.add_argument("--max-tokens", type=int, default=32)
    ns = p.parse_args()
    results = run_pair(worker, ns, timeout_s=600)
    for rank in (0, 1):
        t = results[rank]
        print(f"rank {rank} ({len(t['plan'])} rounds)   p50 us    p99 us")
        for name in (*CONTROL[:4], "all_gather", "forward", "update", "stream", "bare_all_gather"):
            vals = t.get(name, [])
            print(f"  {name:16s} {pct(vals, 50) * 1e6:9.1f} {pct(vals, 99) * 1e6:9.1f}")
        per_round = len(t["plan"])
        control = sum(sum(t.get(k, [])) for k in CONTROL) / per_round
        bare = statistics.median(t["bare_all_gather"])
        print(
            f"  control plane (vote+plan+probe+observe+update+stream) mean per round: "
            f"{control * 1e6:.1f} us = {control / bare:.0%} of the bare gloo all-gather "
            f"median {bare * 1e6:.1f} us (target <= 50%)"
        )
        overhead = sum(t["metrics"]) / sum(t["round"])
        print(
            f"  metrics: observe() p50 {pct(t['metrics'], 50) * 1e6:.1f} us; metrics on adds "
            f"{overhead:.2%} to the mean round time {statistics.mean(t['round']) * 1e3:.2f} ms "
            "(target <= 3%)"
        )


if __name__ == "__main__":
    main()
