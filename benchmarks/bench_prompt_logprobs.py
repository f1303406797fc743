"""What prompt logprobs cost: the runner's decode and prefill throughput when no request asks
(which must not move), and a prefill that asks (which pays for its logits).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_prompt_logprobs.py \\
        [--model smollm2-135m-instruct] [--batch 8] [--prefill-len 1024] [--repeats 5] \\
        [--clock cpu] [--asking 0 5]

Run it with another checkout first on ``PYTHONPATH`` (the same script: it only uses what both
have unless ``--asking`` is given) to compare before and after; alternate the runs so load
spikes hit both alike. Decode tok/s is ``batch / median step`` over the decode rounds;
prefill tok/s is ``prefill_len / best`` of ``--repeats`` one-forward prefills.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

# This checkout's timing code (benchmarks/common.py beside this file) whichever checkout's
# engine is on PYTHONPATH, so a before/after comparison times both the same way.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.round import RoundPlan, ScheduledChunk
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.server_args import ServerArgs

# Process CPU time by default (--clock), steadier on a shared machine.
CLOCK: Callable[[], float] = time.process_time


def asking_prefill_seconds(runner: ModelRunner, prompt: list[int], k: int) -> float:
    """One forward of ``prompt`` for a request that asks for ``k`` prompt logprobs."""
    pool = KVPool(PoolConfig.from_args(runner.args))
    request = Request("p", prompt, SamplingParams(max_tokens=1, prompt_logprobs=k))
    request.page_ids = pool.allocate("p", len(prompt))
    plan = RoundPlan(chunks=[ScheduledChunk(request, 0, len(prompt), True)])
    started = CLOCK()
    result = runner.execute(plan)
    elapsed = CLOCK() - started
    if len(result.prompt_logprobs["p"]) != len(prompt) - 1:
        raise RuntimeError("the runner scored the wrong number of prompt tokens")
    return elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prefill-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    parser.add_argument(
        "--asking", type=int, nargs="*", default=[], help="also time prefills asking for k"
    )
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    runner = ModelRunner(
        ServerArgs(model=args.model, page_size=16, num_kv_pages=1024, device="cpu")
    )
    vocab = min(256, runner.config.vocab_size)
    prompts = common.ragged_prompts(args.batch, 16, 128, vocab=vocab, seed=args.batch)
    steps: list[float] = []
    for _ in range(args.repeats):
        steps += common.runner_decode_steps(runner, prompts, args.new_tokens, CLOCK)
    prompt = common.ragged_prompts(1, args.prefill_len, args.prefill_len, vocab, seed=7)[0]
    prefill = min(common.runner_prefill_seconds(runner, prompt, CLOCK) for _ in range(args.repeats))
    print(f"code {Path(sys.modules['actors'].__path__[0]).parent}, {args.clock} clock")
    print(f"decode  batch {args.batch}: {args.batch / statistics.median(steps):8.1f} tok/s")
    print(f"prefill {args.prefill_len} tokens: {args.prefill_len / prefill:8.1f} tok/s")
    for k in args.asking:
        best = min(asking_prefill_seconds(runner, prompt, k) for _ in range(args.repeats))
        print(f"prefill asking prompt_logprobs={k}: {args.prefill_len / best:8.1f} tok/s")


if __name__ == "__main__":
    main()
