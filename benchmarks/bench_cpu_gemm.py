"""What bounds CPU decode: one linear layer of the default model at decode batch sizes, in
float32 and in the reduced-precision kernels PyTorch ships for x86.

    .venv/bin/python benchmarks/bench_cpu_gemm.py [--threads 1] [--batch-sizes 1 8 32]
    .venv/bin/python benchmarks/bench_cpu_gemm.py --decode-step [--threads 1] [--batch-sizes 1 3 8]

Shapes are SmolLM2-135M's: the fused gate/up projection (576 -> 3072), down (1536 -> 576)
and the tied LM head (576 -> 49152, a fifth of the model's bytes). Kernels:

- ``fp32``: ``F.linear`` on float32 weights (what the engine runs);
- ``bf16``: bfloat16 weights and activations (this CPU has no native bf16: converted);
- ``int8-weight-only``: ``aten._weight_int8pack_mm`` (int8 weights, float activations);
- ``int8-dynamic``: fbgemm's ``quantized.linear_dynamic`` (int8 weights per channel,
  activations quantized per call);
- ``gguf-blocks``: ours (``roundgate.kernels.quant``), the weight as a GGUF file's Q4_1 blocks, what
  ``--gguf-weights packed`` runs (exact to the dequantized weights);
- ``gguf-int8-dot``: the same blocks, activations quantized to 8 bits per block and integer
  dot products (``--gguf-weights int8-dot``, llama.cpp's arithmetic).

Each weight is a fresh tensor larger than the last-level cache would hold for the LM head;
the smaller ones stay cache-resident across repeats, so their float32 figures are a best case.
Prints microseconds per call (median of ``--repeats``) and the ratio to float32.

``--decode-step`` times the packed kernel alone as one decode step of the default model runs
it: 30 layers of distinct Q4_1 weights (qkv, o, gate_up, down, in the model's order, so each
call finds the cache as the model leaves it: the 97 MB of weights do not fit the last level)
and the Q8_0 LM head, each call timed on its own; prints milliseconds per step by shape
(median over ``--repeats`` steps), exact and int8-dot.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import gguf
import numpy as np
import torch
import torch.nn.functional as F

from roundgate.kernels.quant import FORMATS, BlockWeights, block_linear

SHAPES = {"gate_up": (576, 3072), "down": (1536, 576), "lm_head": (576, 49152)}
# One decode step of SmolLM2-135M's GGUF: (in, out) per layer, then the tied Q8_0 LM head.
LAYER_SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
NUM_LAYERS = 30


def median_us(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def kernels(weight: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    int8 = (weight / scale[:, None]).round().to(torch.int8)
    zero = torch.zeros(weight.shape[0], dtype=torch.long)
    qweight = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(qweight, None)
    bf16 = weight.to(torch.bfloat16)
    blocks = q4_1_blocks(weight)
    return {
        "fp32": lambda x: F.linear(x, weight),
        "bf16": lambda x: F.linear(x.to(torch.bfloat16), bf16),
        "int8-weight-only": lambda x: torch.ops.aten._weight_int8pack_mm(x, int8, scale),
        "int8-dynamic": lambda x: torch.ops.quantized.linear_dynamic(x, packed, True),
        "gguf-blocks": lambda x: block_linear(x, blocks),
        "gguf-int8-dot": lambda x: block_linear(x, blocks, int8_dot=True),
    }


def q4_1_blocks(weight: torch.Tensor) -> BlockWeights:
    """``weight`` quantized to Q4_1 by the gguf package (the bytes a GGUF file would hold)."""
    raw = gguf.quants.quantize(weight.numpy(), gguf.GGMLQuantizationType.Q4_1)
    return BlockWeights(
        torch.from_numpy(np.ascontiguousarray(raw)), FORMATS["Q4_1"], weight.shape[1]
    )


def random_blocks(kind: str, fan_in: int, fan_out: int, rng: np.random.Generator) -> BlockWeights:
    """Random raw blocks of ``kind`` (small f16 scales, any quants): timing needs bytes, not
    a trained weight, and the gguf quantizer is too slow for 30 layers."""
    fmt = FORMATS[kind]
    raw = rng.integers(0, 256, (fan_out, fan_in // 32, fmt.block_bytes), dtype=np.uint8)
    scales = 2 if fmt.has_offset else 1
    raw[..., : 2 * scales] = (
        (rng.random((fan_out, fan_in // 32, scales)) * 0.01).astype(np.float16).view(np.uint8)
    )
    return BlockWeights(torch.from_numpy(raw.reshape(fan_out, -1)), fmt, fan_in)


def decode_step_ms(batch: int, int8_dot: bool, repeats: int) -> dict[str, float]:
    """Milliseconds per decode step in each shape's calls (median over ``repeats`` steps)."""
    rng = np.random.default_rng(0)
    layers = [
        {name: random_blocks("Q4_1", i, o, rng) for name, (i, o) in LAYER_SHAPES.items()}
        for _ in range(NUM_LAYERS)
    ]
    head = random_blocks("Q8_0", 576, 49152, rng)
    xs = {k: torch.randn(batch, k) for k in (576, 1536)}
    steps: list[dict[str, float]] = []
    for _ in range(repeats + 1):  # the first step warms up
        spent = dict.fromkeys([*LAYER_SHAPES, "lm_head"], 0.0)
        for layer in layers:
            for name, weights in layer.items():
                x = xs[weights.in_features]
                started = time.perf_counter()
                block_linear(x, weights, int8_dot)
                spent[name] += time.perf_counter() - started
        started = time.perf_counter()
        block_linear(xs[576], head, int8_dot)
        spent["lm_head"] += time.perf_counter() - started
        steps.append(spent)
    return {name: statistics.median(s[name] for s in steps[1:]) * 1e3 for name in steps[0]}


def print_decode_step(batch_sizes: list[int], repeats: int) -> None:
    names = [*LAYER_SHAPES, "lm_head"]
    print(f"{'path':9} {'batch':>5} " + " ".join(f"{n:>8}" for n in names) + "    total  (ms/step)")
    for int8_dot in (False, True):
        for batch in batch_sizes:
            ms = decode_step_ms(batch, int8_dot, repeats)
            cells = " ".join(f"{ms[n]:8.2f}" for n in names)
            path = "int8-dot" if int8_dot else "exact"
            print(f"{path:9} {batch:>5} {cells} {sum(ms.values()):8.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--decode-step", action="store_true", help="the packed kernel alone, per shape"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.decode_step:
        print_decode_step(args.batch_sizes, args.repeats)
        return
    if "x86" in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = "x86"
    print(f"{'layer':8} {'batch':>5} " + " ".join(f"{k:>22}" for k in kernels(torch.ones(2, 32))))
    for name, (fan_in, fan_out) in SHAPES.items():
        weight = torch.randn(fan_out, fan_in) * fan_in**-0.5
        table = kernels(weight)
        for batch in args.batch_sizes:
            x = torch.randn(batch, fan_in)
            times = [median_us(lambda x=x, k=k: k(x), args.repeats) for k in table.values()]
            cells = [f"{us:>10.0f} us ({us / times[0]:4.2f}x)" for us in times]
            print(f"{name:8} {batch:>5} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
