"""Host time a round adds beyond its forward, with ``--async-scheduling`` off and on.

    .venv/bin/python benchmarks/overlap_host_time.py [--batch-sizes 1 16 64] [--rounds 300]
        [--forward-ms 15] [--extra-host-ms 0] [--dp-size 8]

One rank's ``RankLoop`` (the real scheduler, planner and gate) with ``--batch-sizes`` decoding
requests in steady state (they never finish inside the run) over a stand-in forward that
sleeps ``--forward-ms`` (the GIL released, as a GPU forward leaves the host free) and samples
a fixed token. The other ranks' rows are copies of this rank's (a full dp-sized gather for the
gate). ``--extra-host-ms`` adds host work per round that holds the GIL (standing in for what a
rank also does each round: streaming, stats). Per round, the wall time between consecutive
rounds minus that round's forward is the host time the round adds; printed as median and p90
milliseconds for each batch size, overlap off and on.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from roundgate.actors.control.config import SchedulerConfig
from roundgate.actors.control.rank_loop import RankLoop
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.round import RoundPlan, RoundResult
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.rows import RankRow, RoundView

PROMPT_LEN = 64
PAGE_SIZE = 16


class SleepingForward:
    """A forward that sleeps (GIL released) and samples token 1 for every sampling chunk."""

    def __init__(self, forward_s: float) -> None:
        self.forward_s = forward_s
        self.durations: list[float] = []

    def execute(self, plan: RoundPlan, rows: Sequence[RankRow], view: RoundView) -> RoundResult:
        started = time.perf_counter()
        time.sleep(self.forward_s)
        sampled = {c.request.request_id: 1 for c in plan.chunks if c.samples}
        cost = time.perf_counter() - started
        self.durations.append(cost)
        return RoundResult(sampled, cost)


def busy(seconds: float) -> None:
    """Host work that holds the GIL for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def build(batch: int, rounds: int, ns: argparse.Namespace, overlap: bool) -> RankLoop:
    tokens = PROMPT_LEN + rounds + 16
    args = ServerArgs(
        model="tiny-llama",  # dense: an MoE group's forward would hold expert collectives
        dp_size=ns.dp_size,
        max_num_seqs=max(batch, 1) * ns.dp_size,
        max_scheduled_tokens=max(2048, batch * PROMPT_LEN),
        page_size=PAGE_SIZE,
        num_kv_pages=batch * (tokens // PAGE_SIZE + 2),
        prefill_attempt_interval=4,
        prefill_any_attempt_interval=16,
        async_scheduling=overlap,
    )
    # No model: only the pool bounds a sequence (as in the simulator).
    scheduler = Scheduler(SchedulerConfig.from_args(args).replace(max_model_len=None))
    loop = RankLoop(
        scheduler,
        args.build_policy(0),
        SleepingForward(ns.forward_ms / 1000),
        ns.dp_size,
        overlap=overlap,
    )
    for i in range(batch):
        params = SamplingParams(max_tokens=rounds + 8)
        scheduler.add_request(Request(f"r{i}", [2] * PROMPT_LEN, params))
    return loop


def measure(batch: int, ns: argparse.Namespace, overlap: bool) -> tuple[list[float], float]:
    """Host milliseconds each steady round adds beyond its forward, and the forward's median."""
    rounds = ns.warmup + ns.rounds
    loop = build(batch, rounds, ns, overlap)
    forward = loop.executor
    assert isinstance(forward, SleepingForward)
    extra_s = ns.extra_host_ms / 1000
    marks: list[float] = []
    for _ in range(rounds):
        row = loop.begin()
        loop.finish([row] * ns.dp_size)
        busy(extra_s)
        marks.append(time.perf_counter())
    loop.close()
    assert len(loop.scheduler.queues.running) == batch
    median_forward = statistics.median(forward.durations[ns.warmup :])
    intervals = [b - a for a, b in zip(marks[ns.warmup - 1 : -1], marks[ns.warmup :], strict=True)]
    return sorted(1000 * (dt - median_forward) for dt in intervals), 1000 * median_forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--forward-ms", type=float, default=15.0)
    parser.add_argument("--extra-host-ms", type=float, default=0.0)
    parser.add_argument("--dp-size", type=int, default=8)
    ns = parser.parse_args()
    print(
        f"stand-in forward {ns.forward_ms} ms, extra host work {ns.extra_host_ms} ms/round, "
        f"dp {ns.dp_size}, {ns.rounds} rounds"
    )
    print("batch  overlap  host beyond forward, ms: median    p90   (forward median, ms)")
    for batch in ns.batch_sizes:
        for overlap in (False, True):
            added, forward_ms = measure(batch, ns, overlap)
            p90 = added[int(0.9 * (len(added) - 1))]
            print(
                f"{batch:5d}  {'on ' if overlap else 'off'}      "
                f"{statistics.median(added):8.3f}  {p90:8.3f}   ({forward_ms:.3f})"
            )


if __name__ == "__main__":
    main()
