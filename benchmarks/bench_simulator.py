"""Simulator speed: group rounds per second at dp=8 over a long seeded workload.

    .venv/bin/python benchmarks/bench_simulator.py [--policy roundgate] [--rounds 100000]
        [--rate 8] [--workload chat] [--costs h100-dsv3] [--profile]

Runs ``--rounds`` group rounds of the real control plane (``roundgate.sim.spec.simulate``, no
timeline, no progress bar) on a Poisson workload with enough requests to keep the group busy
throughout, and prints rounds/s by wall clock and by process CPU time (steadier on a shared
machine), the mean decodes per rank-round (the per-request share of the work), and the output
tokens/s. ``--profile`` prints the top of a cProfile of the same run instead of timing it.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from roundgate.actors.server_args import ServerArgs
from roundgate.gate import registry
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.spec import SimSpec, simulate
from roundgate.sim.workload import WORKLOADS, WorkloadSpec, generate

# Each policy's own settings (the simulate command's defaults).
POLICY_ARGS = {
    "roundgate": {"prefill_attempt_interval": 4, "prefill_any_attempt_interval": 16},
    "local-interval": {"prefill_decode_interval": 4},
    "vllm-interval": {"prefill_schedule_interval": 2},
}


def build(ns: argparse.Namespace) -> SimSpec:
    args = ServerArgs(
        dp_size=ns.dp_size,
        max_num_seqs=1024,
        max_scheduled_tokens=8192,
        page_size=64,
        num_kv_pages=4096,
        prefill_policy=ns.policy,
        **POLICY_ARGS.get(ns.policy, {}),
    )
    costs = PRESETS[ns.costs]
    preset = WORKLOADS[ns.workload]
    # Enough arrivals to outlast the rounds: a round costs at least the decode base.
    horizon_s = ns.rounds * max(costs.decode_base_ms, 1.0) / 1000.0
    spec = WorkloadSpec(
        num_requests=max(1, int(horizon_s * ns.rate * 2)),
        rate=ns.rate,
        input_len=preset.input_len,
        output_len=preset.output_len,
        length_dist=preset.length_dist,
        seed=ns.seed,
    )
    # Drawn here, outside the clock: the benchmark times the simulation, not the workload.
    arrivals = tuple(generate(spec))
    return SimSpec(args, arrivals, costs, seed=ns.seed, max_rounds=ns.rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="roundgate", choices=registry.names())
    parser.add_argument("--rounds", type=int, default=100_000)
    parser.add_argument("--dp-size", type=int, default=8)
    parser.add_argument("--rate", type=float, default=8.0, help="requests/s, whole group")
    parser.add_argument("--workload", default="chat", choices=sorted(WORKLOADS))
    parser.add_argument("--costs", default="h100-dsv3", choices=sorted(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true")
    ns = parser.parse_args()
    spec = build(ns)
    if ns.profile:
        profile = cProfile.Profile()
        profile.runcall(simulate, spec)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(spec)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    decodes = sum(r.num_output for r in result.records)
    print(
        f"policy {ns.policy}  dp {ns.dp_size}  rounds {result.rounds}  "
        f"({result.prefill_rounds} with prefill)  workload {ns.workload} @ {ns.rate:g} req/s, "
        f"costs {ns.costs}"
    )
    print(
        f"rounds/s: {result.rounds / wall:,.0f} wall, {result.rounds / cpu:,.0f} cpu  "
        f"({1e6 * cpu / result.rounds:.1f} us cpu per group round)  "
        f"decodes per rank-round {decodes / result.rounds / ns.dp_size:.1f}"
    )


if __name__ == "__main__":
    main()
