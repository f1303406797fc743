"""Where a rank builds its engine matters: one OpenMP thread pool per rank, or two.

    .venv/bin/python benchmarks/bench_engine_thread.py [--threads 2] [--gguf-weights packed]
        [--new-tokens 128] [--repeats 3]

libgomp keeps one pool of worker threads per thread that opens a parallel region. When its
pools hold more threads than the process has CPUs, idle workers stop spinning between
regions (libgomp's "throttled" spin) and sleep on a futex, so each of the hundreds of
parallel regions of a decode step waits for a wake-up. A Serve rank that built its model in
an executor thread (which stays alive, its pool with it) and ran rounds in its engine thread
had two pools. This runs the offline engine's batch-1 decode three ways, in one process
each: built and run on the main thread; built and run on one other thread (what the rank
replica does); built on an executor thread that stays alive and run on another (what it did).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

MODES = ("main", "engine-thread", "executor-build")


def decode_tok_s(threads: int, weights: str, new_tokens: int, repeats: int, mode: str) -> float:
    """Batch-1 decode tokens/s (median round of each request, median over requests)."""
    import torch

    from roundgate.actors.control.engine_core import EngineCore
    from roundgate.actors.control.request import Request, SamplingParams
    from roundgate.actors.model.runner import ModelRunner
    from roundgate.actors.server_args import ServerArgs

    torch.set_num_threads(threads)
    args = ServerArgs(model="smollm2-135m-instruct", device="cpu", gguf_weights=weights)

    def build() -> EngineCore:
        return EngineCore(args, ModelRunner(args))

    def run(core: EngineCore) -> float:
        gen = torch.Generator().manual_seed(0)
        medians = []
        for i in range(repeats):
            ids = torch.randint(0, args.model_config.vocab_size, (32,), generator=gen).tolist()
            core.submit(Request(f"r{i}", ids, SamplingParams(max_tokens=new_tokens)))
            rounds = []
            while core.has_local_work:
                started = time.perf_counter()
                core.step()
                rounds.append(time.perf_counter() - started)
            medians.append(statistics.median(rounds[1:]))  # the prefill round left out
        return 1 / statistics.median(medians)

    if mode == "main":
        return run(build())
    result: list[float] = []
    if mode == "engine-thread":
        thread = threading.Thread(target=lambda: result.append(run(build())))
    else:
        executor = ThreadPoolExecutor(1)  # kept alive, as asyncio's default executor is
        core = executor.submit(build).result()
        thread = threading.Thread(target=lambda: result.append(run(core)))
    thread.start()
    thread.join()
    return result[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gguf-weights", default="packed")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", choices=MODES, default=None, help="one mode, in this process")
    ns = parser.parse_args(argv)
    if ns.mode is not None:
        tok_s = decode_tok_s(ns.threads, ns.gguf_weights, ns.new_tokens, ns.repeats, ns.mode)
        print(f"{tok_s:.1f}")
        return
    print(f"batch-1 decode, {ns.threads} threads, --gguf-weights {ns.gguf_weights}")
    for mode in MODES:  # a fresh process each: libgomp's pools live as long as the process
        command = [sys.executable, __file__, "--mode", mode, *(argv or sys.argv[1:])]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        print(f"  {mode:15s} {out.strip()} tok/s", flush=True)


if __name__ == "__main__":
    main()
