"""Control-plane cost of one rank-round: vote + plan + probe + observe + update.

    .venv/bin/python benchmarks/bench_control_plane.py [--running 64] [--rounds 5000]
        [--policy roundgate] [--dp-size 8]

One rank's ``RankLoop`` with ``--running`` decoding requests that never finish inside the
run (steady state: every round plans, publishes and updates all of them). The other ranks'
rows are copies of this rank's, so the policy sees a full dp-sized gather. Each round is
timed around ``begin`` (vote, plan, probe, row) and ``finish`` (observe, forward, update);
the forward is the cost executor, which only prices the plan and returns a token for every
sampling request. Prints the median and p90 microseconds per rank-round (target <= 100 us
median with 64 running requests), by wall clock and by thread CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import time

from roundgate.actors.control.config import SchedulerConfig
from roundgate.actors.control.rank_loop import RankLoop
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.server_args import ServerArgs
from roundgate.gate import registry
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY

POLICY_ARGS = {
    "roundgate": {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16},
    "local-interval": {"prefill_decode_interval": 4},
    "vllm-interval": {"prefill_schedule_interval": 2},
}


def build(ns: argparse.Namespace) -> RankLoop:
    rounds = ns.warmup + ns.rounds
    tokens = ns.prompt_len + rounds + 16
    page_size = 16
    args = ServerArgs(
        dp_size=ns.dp_size,
        max_num_seqs=ns.running * ns.dp_size,
        max_scheduled_tokens=max(8192, ns.running * ns.prompt_len),
        page_size=page_size,
        num_kv_pages=ns.running * (tokens // page_size + 2),
        prefill_policy=ns.policy,
        **POLICY_ARGS.get(ns.policy, {}),
    )
    # No model: only the pool bounds a sequence (as in the simulator).
    scheduler = Scheduler(SchedulerConfig.from_args(args).replace(max_model_len=None))
    loop = RankLoop(scheduler, args.build_policy(0), CostExecutor(TOY), ns.dp_size, clock=lambda: 0)
    for i in range(ns.running):
        params = SamplingParams(max_tokens=rounds + 8)
        loop.scheduler.add_request(Request(f"r{i}", [1] * ns.prompt_len, params))
    return loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--dp-size", type=int, default=8)
    parser.add_argument("--policy", default="roundgate", choices=registry.names())
    ns = parser.parse_args()
    loop = build(ns)
    wall: list[float] = []
    cpu: list[float] = []
    for i in range(ns.warmup + ns.rounds):
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        row = loop.begin()
        loop.finish([row] * ns.dp_size)
        c, w = time.thread_time_ns() - c, time.perf_counter_ns() - w
        if i >= ns.warmup:
            wall.append(w / 1000)
            cpu.append(c / 1000)
    running = len(loop.scheduler.queues.running)
    assert running == ns.running, f"{running} running, expected {ns.running}"
    wall.sort()
    cpu.sort()
    p90 = int(0.9 * len(wall))
    print(f"policy {ns.policy}, dp {ns.dp_size}, {running} running requests, {ns.rounds} rounds")
    print(
        f"us per rank-round: median {statistics.median(wall):.1f} wall "
        f"({statistics.median(cpu):.1f} cpu), p90 {wall[p90]:.1f} wall ({cpu[p90]:.1f} cpu)"
    )


if __name__ == "__main__":
    main()
