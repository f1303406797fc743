"""Why ``--gguf-weights int8-dot`` runs llama.cpp's float operations too, not only its integer
products: the evidence, measured. (With torch's RMSNorm, RoPE, SwiGLU and attention between
ggml's products, the int8-dot model followed llama.cpp's free-running greedy tokens on 4 to 6
of 10 prompts; with ggml's arithmetic, ``kernels/quant/ggml_arith.cpp``, on 10 of 10.)

    .venv/bin/python benchmarks/int8_dot_sensitivity.py [--model smollm2-135m-instruct]

1. Sensitivity. Our own model, int8-dot and exact (``packed``), both with torch's float
   operations layer by layer (``torch_arithmetic``: as before the change), run twice on the ten
   prompts of tests/integration/test_int8_dot_vs_llamacpp.py: as it is, and with RMSNorm's mean
   of squares summed in float64 instead of float32 (the normed activations at most an ulp or so
   apart). Printed: on how many prompts the 32 free-running greedy tokens stay the same, and how
   far the per-position log-probabilities move (teacher-forced on the first run's tokens). A
   forward whose activations are rounded to 8 bits amplifies such a nudge into differences of
   the size that separated it from llama.cpp; the float32 one does not.
2. The operations between the products (when ``make llamacpp`` has run): ggml's RMSNorm, SwiGLU,
   softmax, RoPE and float32 product (``bench/ggml_ops.py``) against the torch operations
   the model ran before (the other weight paths' layer-by-layer prefill still does), on random
   inputs of the model's shapes: the share of elements that differ in any bit. Each differing
   element is a nudge like the one in part 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.engine import Engine
from roundgate.actors.model import layers
from roundgate.actors.model.decoder import rotary_table
from roundgate.actors.model.rope import RotaryTable, apply_rope
from roundgate.actors.model.tokenizer import load_tokenizer
from roundgate.actors.server_args import ServerArgs
from roundgate.bench import ggml_ops
from roundgate.bench.llamacpp import LLAMACPP_VENV, NEW_TOKENS, PROMPTS
from roundgate.kernels.attention.torch_ref import TorchAttention


def nudged_rms_norm(self: layers.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """``RMSNorm.forward`` with the mean of squares summed in float64: the same function,
    rounded differently in the last bits."""
    xf = x.float()
    mean_square = (xf * xf).double().mean(-1, keepdim=True).float()
    return self.weight * (xf * torch.rsqrt(mean_square + self.eps)).to(x.dtype)


@contextmanager
def nudged() -> Iterator[None]:
    original = layers.RMSNorm.forward
    layers.RMSNorm.forward = nudged_rms_norm  # type: ignore[method-assign]
    try:
        yield
    finally:
        layers.RMSNorm.forward = original  # type: ignore[method-assign]


def token_logprobs(
    engine: Engine, prompts: list[list[int]], outputs: list[list[int]]
) -> np.ndarray:
    """The log-probability of each output token, teacher-forced."""
    found: list[float] = []
    for i, (ids, out) in enumerate(zip(prompts, outputs, strict=True)):
        request = Request(f"s{i}", ids + out, SamplingParams(max_tokens=1, prompt_logprobs=1))
        engine.run([request])
        found += [entry.logprob for entry in request.prompt_logprobs[len(ids) - 1 :]]
    return np.array(found)


def torch_arithmetic(engine: Engine) -> None:
    """Back to torch's float operations, layer by layer (no fused decoder, no llama.cpp
    arithmetic), the products unchanged: what the nudge below is applied to."""
    runner = engine.runner
    runner.model.fused = None
    for module in runner.model.modules():
        if hasattr(module, "llamacpp"):
            module.llamacpp = False
    runner.model.rotary = rotary_table(runner.config)
    runner.attention = TorchAttention()


def sensitivity(model: str, path: str) -> str:
    engine = Engine(
        ServerArgs(model=model, device="cpu", num_kv_pages=64, max_num_seqs=10, gguf_weights=path)
    )
    torch_arithmetic(engine)
    tokenizer = load_tokenizer(model)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    greedy = SamplingParams(max_tokens=NEW_TOKENS)
    base = engine.generate(prompts, greedy)
    base_lp = token_logprobs(engine, prompts, base)
    with nudged():
        other = engine.generate(prompts, greedy)
        other_lp = token_logprobs(engine, prompts, base)
    same = sum(a == b for a, b in zip(base, other, strict=True))
    gap = np.abs(base_lp - other_lp)
    return (
        f"| {path} | {same}/{len(prompts)} | {np.median(gap):.1e} | "
        f"{np.percentile(gap, 90):.1e} | {gap.max():.1e} |"
    )


def op_cases(rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inputs for ggml (``ggml_ops`` cases) and the same operations computed by torch as our
    model does (SmolLM2-135M's widths: hidden 576, MLP 1536, head 64, 9 heads, 40 positions)."""
    t, n = 7, 40
    f32 = {
        "x": rng.standard_normal((t, 576)) * 3,
        "w": rng.random(576) * 2,
        "gate": rng.standard_normal((t, 1536)) * 2,
        "up": rng.standard_normal((t, 1536)),
        "scores": rng.standard_normal((t, n)) * 8,
        "mask": np.where(np.arange(n)[None] <= np.arange(t)[:, None] + n - t, 0.0, -np.inf),
        "q": rng.standard_normal((t, 64)),
        "k": rng.standard_normal((n, 64)),
        "halves": rng.standard_normal((t, 9, 64)),  # ours: the two halves rotate together
    }
    f32 = {name: a.astype(np.float32) for name, a in f32.items()}
    pairs = np.empty_like(f32["halves"])  # llama.cpp's layout (the GGUF's): adjacent pairs
    pairs[..., 0::2], pairs[..., 1::2] = f32["halves"][..., :32], f32["halves"][..., 32:]
    positions = np.arange(n - t, n, dtype=np.int32)
    cases = {
        "rms_norm": ("rms_norm_mul", f32["x"], f32["w"], [1e-5]),
        "swiglu": ("swiglu", f32["gate"], f32["up"], []),
        "softmax": ("soft_max", f32["scores"], f32["mask"], [0.125]),
        "rope": ("rope", pairs, positions, [64, 100000.0, 8192]),
        "f32 product": ("mul_mat", f32["k"], f32["q"], []),
    }
    inputs: dict[str, np.ndarray] = {}
    for c, (op, a, b, params) in cases.items():
        inputs |= {f"op_{c}": np.array(op), f"a_{c}": a, f"b_{c}": b}
        inputs |= {f"kind_{c}": np.array("F32"), f"params_{c}": np.array(params, np.float64)}
    tt = {name: torch.from_numpy(a) for name, a in f32.items()}
    tt["positions"] = torch.from_numpy(positions).long()
    norm = layers.RMSNorm(576, 1e-5)
    norm.weight.data.copy_(tt["w"])
    cos, sin = RotaryTable(64, 8192, 100000.0).lookup(tt["positions"], torch.float32)
    rotated = apply_rope(tt["halves"], cos, sin).numpy()
    rotated_pairs = np.empty_like(rotated)
    rotated_pairs[..., 0::2], rotated_pairs[..., 1::2] = rotated[..., :32], rotated[..., 32:]
    with torch.no_grad():
        ours = {
            "rms_norm": norm(tt["x"]).numpy(),
            "swiglu": (F.silu(tt["gate"]) * tt["up"]).numpy(),
            "softmax": torch.softmax(tt["scores"] * 0.125 + tt["mask"], -1).numpy(),
            "rope": rotated_pairs,
            "f32 product": (tt["q"] @ tt["k"].T).numpy(),
        }
    return inputs, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("1. A <= 1-ulp RMSNorm nudge: same 32 greedy tokens, and |log-probability| moved")
    print("| weights | same tokens | median | p90 | max |\n|---|---|---|---|---|")
    for path in ("int8-dot", "packed"):
        print(sensitivity(args.model, path), flush=True)
    library = ggml_ops.library_path(LLAMACPP_VENV)
    if library is None:
        print("2. skipped: no xllamacpp library (run `make llamacpp`)")
        return
    inputs, ours = op_cases(np.random.default_rng(1))
    theirs = ggml_ops.compute(library, inputs)
    print("\n2. Our operations against ggml's: elements that differ in any bit")
    print("| operation | differ | largest difference |\n|---|---|---|")
    for name, mine in ours.items():
        ref = theirs[f"y_{name}"]
        finite = np.isfinite(ref)
        differ = np.mean(mine[finite] != ref[finite])
        print(f"| {name} | {differ:.0%} | {np.abs(mine - ref)[finite].max():.1e} |")


if __name__ == "__main__":
    main()
