"""The CPU engine's three GGUF weight paths, and what a second thread buys each part.

    .venv/bin/python benchmarks/bench_weight_paths.py [--model smollm2-135m-instruct]
        [--threads 1 2] [--paths float packed int8-dot] [--repeats 3]

For each ``--gguf-weights`` path: the bytes of linear weights one decode step reads, then per
thread count the ModelRunner's batch-1 and batch-8 decode (tokens/s from the median step,
which shrugs off load spikes on a shared machine) and a 256-token prefill (best of
``--repeats``). Then the parts alone, 1 thread against 2: the packed kernel on the LM head's
shape (exact and int8-dot, batch 1 and 8) and the paged attention of one layer (batch 8,
320 tokens of context), so a poor scaling figure can be pinned on its part.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from common import ragged_prompts, runner_decode_steps, runner_prefill_seconds

from roundgate.actors.model.gguf_blocks import decode_weight_bytes
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.server_args import ServerArgs
from roundgate.kernels.attention.batch import PagedKVCache, build_attention_batch
from roundgate.kernels.attention.torch_ref import TorchAttention
from roundgate.kernels.quant import BlockLinear


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def model_rows(runner: ModelRunner, threads: int, repeats: int, new_tokens: int) -> list[str]:
    torch.set_num_threads(threads)
    vocab = runner.config.vocab_size
    out = []
    for batch in (1, 8):
        prompts = ragged_prompts(batch, 32, 96, vocab=vocab, seed=batch)
        steps: list[float] = []
        for _ in range(repeats):
            steps += runner_decode_steps(runner, prompts, new_tokens)
        out.append(f"decode b{batch} {batch / statistics.median(steps):7.1f} tok/s")
    prompt = ragged_prompts(1, 256, 256, vocab=vocab, seed=7)[0]
    best = min(runner_prefill_seconds(runner, prompt) for _ in range(repeats))
    out.append(f"prefill 256 {256 / best:7.0f} tok/s")
    return out


def part_rows(runner: ModelRunner, repeats: int) -> list[str]:
    """The LM head's kernel and one layer's attention, 1 thread and 2."""
    head = runner.model.get_submodule("lm_head")
    rows = []
    if isinstance(head, BlockLinear):
        for int8_dot in (False, True):
            layer = BlockLinear(head.weights, int8_dot)
            for batch in (1, 8):
                x = torch.randn(batch, head.in_features)
                t = [0.0, 0.0]
                for i, threads in enumerate((1, 2)):
                    torch.set_num_threads(threads)
                    t[i] = median_seconds(lambda layer=layer, x=x: layer(x), repeats * 10)
                name = "int8-dot" if int8_dot else "exact"
                rows.append(
                    f"lm_head {name:8} b{batch}: {t[0] * 1e3:6.2f} ms -> {t[1] * 1e3:6.2f} ms "
                    f"(x{t[0] / t[1]:.2f})"
                )
    config, batch, context, page = runner.config, 8, 320, 16
    pages_per_seq = context // page + 1
    cache = PagedKVCache.allocate(
        1, batch * pages_per_seq, page, config.num_kv_heads, config.head_dim, torch.float32, "cpu"
    )
    tables = [list(range(b * pages_per_seq, (b + 1) * pages_per_seq)) for b in range(batch)]
    attn_batch = build_attention_batch([1] * batch, [context] * batch, tables, page)
    backend = TorchAttention()
    q = torch.randn(batch, config.num_heads, config.head_dim)
    k = torch.randn(batch, config.num_kv_heads, config.head_dim)

    def attend() -> torch.Tensor:
        state = backend.prepare(attn_batch)
        return backend.forward(0, q, k, k, cache, attn_batch, state, 0.125)

    t = [0.0, 0.0]
    for i, threads in enumerate((1, 2)):
        torch.set_num_threads(threads)
        t[i] = median_seconds(attend, repeats * 20)
    rows.append(
        f"attention b{batch} ctx {context} (1 layer): {t[0] * 1e3:6.3f} ms -> "
        f"{t[1] * 1e3:6.3f} ms (x{t[0] / t[1]:.2f})"
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--paths", nargs="+", default=["float", "packed", "int8-dot"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    print(f"model {args.model}, {torch.get_num_threads()} cores visible to torch")
    packed = None
    for path in args.paths:
        runner = ModelRunner(
            ServerArgs(model=args.model, device="cpu", num_kv_pages=256, gguf_weights=path)
        )
        mib = decode_weight_bytes(runner.model) / 2**20
        print(f"{path:9} ({runner.weight_path}): {mib:6.1f} MiB of linear weights per step")
        for threads in args.threads:
            row = model_rows(runner, threads, args.repeats, args.new_tokens)
            print(f"  {threads} thread(s): " + ", ".join(row))
        if path == "packed":
            packed = runner
    if packed is not None:
        for row in part_rows(packed, args.repeats):
            print("  " + row)


if __name__ == "__main__":
    main()
