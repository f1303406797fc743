"""P/D routing in the simulator: the prefill and decode choices under each router, on sessions.

    PYTHONPATH=. .venv/bin/python benchmarks/sim_pd_routing.py \
        [--json docs/results/pd_routing_sim.json] [--seeds 0,1,2]

Runs ``roundgate simulate --disaggregate P:D --workload chat-sessions --router R`` (gb200-dsv3,
the routing matrix's group: page 64, 4096 pages a rank, prefix caching and mixed batches on)
for round-robin, cache-aware (the ingress's guess), kv-aware (the ranks' own KV events, both
groups: ``roundgate.routing.kv_router`` and ``decode_load``) and the oracle (kv-aware's cost
on the pools themselves), at each split and session rate, once per seed, and prints the
medians over the seeds of the P/D arm: prefix hit rate (the prefill ranks' counters), TTFT
p50/p99, ITL p99 and throughput. Every number is simulated; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from roundgate.cli.main import main as roundgate

ROUTERS = ("round-robin", "cache-aware", "kv-aware", "oracle")
# (split, total ranks, sessions, session rates/s): the matrix's dp=8 chat-sessions loads on
# 4+8 ranks, and its dp=64 light load on 16+48.
CELLS = (("4:8", 8, 64, (4.0, 16.0)), ("16:48", 64, 512, (16.0,)))


def argv_of(split: str, dp: int, sessions: int, rate: float, router: str, seed: int) -> list[str]:
    return (
        f"simulate --disaggregate {split} --costs gb200-dsv3 --workload chat-sessions "
        f"--num-sessions {sessions} --rate {rate:g} --seed {seed} --dp-size {dp} "
        f"--max-num-seqs {1024 * dp} --max-scheduled-tokens 8192 --page-size 64 "
        f"--num-kv-pages 4096 --enable-prefix-caching --enable-mixed-prefill-decode "
        f"--router {router} --compare none --no-progress"
    ).split()


def pd_arm(argv: list[str]) -> dict:
    """The P/D arm's summary of one ``roundgate simulate`` run."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.json"
        if roundgate([*argv, "--json", str(path)]) != 0:
            raise RuntimeError(f"roundgate {' '.join(argv)} failed")
        results = json.loads(path.read_text())["results"]
    (pd,) = [r for r in results if r["policy"].startswith("pd ")]
    return {
        "hit_rate": pd["prefix_hit_rate"],
        "ttft_p50": pd["ttft_ms"]["p50"],
        "ttft_p99": pd["ttft_ms"]["p99"],
        "itl_p99": pd["itl_ms"]["p99"],
        "out_tok_s": pd["output_tokens_per_s"],
        "unfinished": pd["unfinished"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--seeds", default="0,1,2")
    ns = parser.parse_args()
    seeds = [int(s) for s in ns.seeds.split(",")]
    rows = []
    for split, dp, sessions, rates in CELLS:
        for rate in rates:
            for router in ROUTERS:
                runs = []
                for seed in seeds:
                    argv = argv_of(split, dp, sessions, rate, router, seed)
                    runs.append({"seed": seed, "command": "roundgate " + " ".join(argv)})
                    runs[-1] |= pd_arm(argv)
                keys = ("hit_rate", "ttft_p50", "ttft_p99", "itl_p99", "out_tok_s")
                medians = {k: statistics.median(r[k] for r in runs) for k in keys}
                rows.append({"split": split, "sessions": sessions, "rate": rate,
                             "router": router, **medians, "runs": runs})  # fmt: skip
    print("| split | sessions, rate/s | router | hit rate | TTFT p50 ms | TTFT p99 ms | ITL p99 ms "
          "| out tok/s |\n| --- | --- | --- | --- | --- | --- | --- | --- |")  # fmt: skip
    for r in rows:
        print(
            f"| {r['split']} | {r['sessions']}, {r['rate']:g} | {r['router']} | "
            f"{r['hit_rate']:.3f} | {r['ttft_p50']:,.0f} | {r['ttft_p99']:,.0f} | "
            f"{r['itl_p99']:.1f} | {r['out_tok_s']:,.0f} |"
        )
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps({"seeds": seeds, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
