"""Decode and prefill throughput of ModelRunner vs transformers on the same model.

    .venv/bin/python benchmarks/bench_model.py [--model tiny-llama | smollm2-135m-instruct |
        FILE.gguf | HF_DIR] [--batch-sizes 1 8 32] [--threads 1] [--clock wall|cpu] [--repeats 3]

A random preset is exported for transformers; a GGUF model is loaded by transformers from the
same file (``gguf_file=``, dequantized to float32, as ours is).

Decode: ragged prompts (seeded lengths), one prefill round, then greedy decode rounds up
to ``--new-tokens``; every decode step is timed on its own (ModelRunner: one ``execute``;
transformers: ``generate`` on the left-padded batch, the gap between consecutive sampling
points, taken by a no-op logits processor) and tokens/s is ``batch / median step``, which
shrugs off load spikes on a shared machine. Prefill: one 2,048-token prompt through one
forward, best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from common import ragged_prompts, runner_decode_steps, runner_prefill_seconds

from roundgate.actors.model.config import PRESETS
from roundgate.actors.model.gguf_file import find_gguf
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.model.weights import random_hf_state, save_hf_dir
from roundgate.actors.server_args import ServerArgs

# Wall clock by default; --clock cpu switches to process CPU time, steadier on a shared
# machine (with --threads 1 it is the compute actually spent).
CLOCK: Callable[[], float] = time.perf_counter


def best_of_interleaved(repeats: int, *runs: Callable[[], float]) -> list[float]:
    """Best (minimum) seconds of each run, alternating them so load spikes hit all alike."""
    best = [float("inf")] * len(runs)
    for _ in range(repeats):
        for i, run in enumerate(runs):
            best[i] = min(best[i], run())
    return best


class StepClock:
    """A logits processor that only records when each generation step reaches sampling."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.marks.append(CLOCK())
        return scores


def hf_decode_steps(model, prompts: list[list[int]], new_tokens: int) -> list[float]:
    """Seconds of each ``generate`` decode step: the gaps between consecutive sampling points
    (each gap is one full step: sampling, cache update and the next forward)."""
    from transformers import LogitsProcessorList

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    clock = StepClock()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            logits_processor=LogitsProcessorList([clock]),
        )
    if out.shape[1] != width + new_tokens:
        raise RuntimeError("transformers stopped early; the comparison needs full length")
    return [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]


def hf_prefill_seconds(model, prompt: list[int]) -> float:
    started = CLOCK()
    with torch.inference_mode():
        model(torch.tensor([prompt])).logits[:, -1].argmax(-1)
    return CLOCK() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-llama", help="a preset, .gguf or HF directory")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=[16, 128])
    parser.add_argument("--prefill-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for both engines (0: torch's default); one by default "
        "because matmuls this small gain nothing from more, and on a shared 2-core machine "
        "a second OpenMP thread stalls both engines unpredictably",
    )
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    server_args = ServerArgs(
        model=args.model, page_size=args.page_size, num_kv_pages=1024, device="cpu"
    )
    config = server_args.model_config
    runner = ModelRunner(server_args)
    gguf = find_gguf(args.model)
    if args.model in PRESETS:
        with tempfile.TemporaryDirectory() as tmp:
            save_hf_dir(config, random_hf_state(config, server_args.seed), tmp)
            hf = AutoModelForCausalLM.from_pretrained(tmp, attn_implementation="sdpa").eval()
    elif gguf is not None:
        hf = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
    else:
        hf = AutoModelForCausalLM.from_pretrained(
            args.model, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()

    print(
        f"model {args.model}, torch threads {torch.get_num_threads()}, "
        f"page size {args.page_size}, {args.clock} clock"
    )
    print(f"{'batch':>5} {'runner tok/s':>13} {'hf tok/s':>10} {'ratio':>6}")
    vocab = min(256, config.vocab_size)
    for batch in args.batch_sizes:
        prompts = ragged_prompts(batch, *args.prompt_len, vocab=vocab, seed=batch)
        ours_steps: list[float] = []
        theirs_steps: list[float] = []
        for _ in range(args.repeats):  # alternate so load spikes hit both alike
            ours_steps += runner_decode_steps(runner, prompts, args.new_tokens, CLOCK)
            theirs_steps += hf_decode_steps(hf, prompts, args.new_tokens)
        ours, theirs = statistics.median(ours_steps), statistics.median(theirs_steps)
        print(f"{batch:>5} {batch / ours:>13.0f} {batch / theirs:>10.0f} {theirs / ours:>6.2f}")

    prompt = ragged_prompts(1, args.prefill_len, args.prefill_len, vocab=vocab, seed=7)[0]
    ours, theirs = best_of_interleaved(
        args.repeats,
        lambda: runner_prefill_seconds(runner, prompt, CLOCK),
        lambda: hf_prefill_seconds(hf, prompt),
    )
    n = args.prefill_len
    print(
        f"prefill {n} tokens: runner {n / ours:.0f} tok/s, hf {n / theirs:.0f} tok/s, "
        f"ratio {theirs / ours:.2f}"
    )


if __name__ == "__main__":
    main()
