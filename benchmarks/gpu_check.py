"""Engine parity and decode speed on a GPU, for ``benchmarks/gpu_check.sh`` (CUDA only).

    python3 benchmarks/gpu_check.py [--json PATH] [--batch 32] [--new-tokens 64]

1. Greedy parity: the offline Engine on the tiny presets, with the torch backends (eager),
   the Triton kernels eager (``--enforce-eager``) and the Triton kernels with decode CUDA
   graphs (dense models only: MoE never captures). Reported as tokens equal or not (bf16 on
   CUDA, so a near-tie may flip a token; the CPU tests check exact parity in float32).
2. Decode throughput: a random Llama-shaped model (about 0.2 B parameters, written to a temp
   dir) decoding ``--batch`` sequences for ``--new-tokens`` tokens in one Engine run, after a
   warm-up run of the same prompts (kernels compiled, the bucket captured, the prompts in the
   prefix cache); tokens/s for torch eager, triton eager and triton + graphs.

3. FP8 GEMM parity: the Triton block-FP8 GEMM (``kernels/quant/triton_fp8_gemm.py``) and the
   FP8 experts (``triton_fp8_experts.py``) at DeepSeek-V3's widths against their torch
   references, as the largest error over ``|x_q| @ |W|^T`` (the scale of the product). Fails
   above ``FP8_TOLERANCE``: on sm_90 the FP8 MMA accumulates each 128-wide step with less than
   float32's precision, so the interpreter's float32 bound (docs/fp8.md) is not the GPU's.
4. The backends ``auto`` picks here for a DeepSeek-V3-shaped rank (MLA, MoE, 8 ranks) and a
   GQA one: a fused backend that cannot run (its package missing) fails the check by name
   instead of being skipped.

Prints one JSON document (and writes it to ``--json``); exits 1 when a parity or backend check
fails. Needs torch with CUDA and triton; nothing else beyond the project's own packages.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

import torch

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.model.config import PRESETS, with_overrides
from roundgate.actors.model.weights import random_hf_state, save_hf_dir
from roundgate.actors.server_args import ServerArgs

PROMPTS = [[5, 7, 9], list(range(20, 37)), [3, 1, 4, 1, 5, 9, 2, 6, 5], [250, 11, 42, 42, 7, 8]]
VARIANTS: dict[str, dict[str, Any]] = {
    "torch": {"attention_backend": "torch", "enforce_eager": True},
    "triton_eager": {"attention_backend": "triton", "moe_kernel": "triton", "enforce_eager": True},
    "triton_graphs": {"attention_backend": "triton", "moe_kernel": "triton"},
}


def parity(device: str = "cuda") -> dict[str, Any]:
    """Greedy tokens of every variant, compared with the torch backends'."""
    results: dict[str, Any] = {}
    for model in ("tiny-llama", "tiny-moe"):
        outputs = {}
        for name, flags in VARIANTS.items():
            args = ServerArgs(
                model=model,
                device=device,
                page_size=4,
                num_kv_pages=256,
                max_scheduled_tokens=5,
                **flags,
            )
            engine = Engine(args)
            outputs[name] = engine.generate(PROMPTS, SamplingParams(max_tokens=16))
            if engine.runner.graphs is not None:
                outputs[name + "_replays"] = engine.runner.graphs.num_replays
        results[model] = {
            name: outputs[name] == outputs["torch"] for name in VARIANTS if name != "torch"
        } | {k: v for k, v in outputs.items() if k.endswith("_replays")}
    return results


def throughput(batch: int, new_tokens: int, device: str = "cuda") -> dict[str, float]:
    """Decode tokens/s of each variant on a random 0.2 B Llama-shaped model."""
    config = with_overrides(
        PRESETS["tiny-llama"],
        vocab_size=32000,
        hidden_size=1024,
        num_layers=12,
        num_heads=16,
        num_kv_heads=4,
        head_dim=64,
        intermediate_size=2816,
        eos_token_ids=(),  # decode every one of --new-tokens
    )
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        save_hf_dir(config, random_hf_state(config, 0), tmp)
        prompts = [[(7 * i + j) % 32000 for j in range(32)] for i in range(batch)]
        for name, flags in VARIANTS.items():
            args = ServerArgs(
                model=tmp,
                device=device,
                num_kv_pages=4096,
                max_num_seqs=batch,
                **{k: v for k, v in flags.items() if k != "moe_kernel"},
            )
            engine = Engine(args)
            # Warm up: compile the kernels, capture the batch's bucket, and cache the prompts
            # (the timed run's prefill is then one token a prompt: it times decoding).
            engine.generate(prompts, SamplingParams(max_tokens=4))
            _sync(device)
            started = time.perf_counter()
            outputs = engine.generate(prompts, SamplingParams(max_tokens=new_tokens))
            _sync(device)
            elapsed = time.perf_counter() - started
            rates[name] = round(sum(len(o) for o in outputs) / elapsed, 1)
    return rates


# Largest error of the FP8 products over the scale of the product (|x_q| @ |W|^T), on a GPU.
FP8_TOLERANCE = 2e-3
# (rows, out, in): decode and prefill rows at DeepSeek-V3's q_a + kv_a, o_proj, and an expert's
# down projection widths.
FP8_GEMM_SHAPES = [(1, 2112, 7168), (16, 7168, 16384), (200, 7168, 2048)]


# (hidden, moe_intermediate, rows per local expert): DeepSeek-V3's experts, rows uneven.
FP8_EXPERTS = (7168, 2048, [5, 0, 17, 1, 64, 3, 0, 9])


def fp8_parity(
    device: str = "cuda",
    gemm_shapes: list[tuple[int, int, int]] = FP8_GEMM_SHAPES,
    experts_shape: tuple[int, int, list[int]] = FP8_EXPERTS,
) -> dict[str, Any]:
    """The FP8 GEMM and experts against their references (see ``FP8_TOLERANCE``); the
    shapes are DeepSeek-V3's unless given (the test runs small ones under the interpreter)."""
    from roundgate.kernels.quant.fp8_blocks import (
        fp8_gemm_reference,
        quantize_activations,
        quantize_weight_blocks,
    )
    from roundgate.kernels.quant.triton_fp8_experts import fp8_run_experts
    from roundgate.kernels.quant.triton_fp8_gemm import fp8_block_gemm

    gen = torch.Generator(device="cpu").manual_seed(0)
    results: dict[str, Any] = {}
    for rows, out, inp in gemm_shapes:
        x = torch.randn(rows, inp, generator=gen).to(device)
        codes, scales = quantize_weight_blocks(torch.randn(out, inp, generator=gen) / inp**0.5)
        codes, scales = codes.to(device), scales.to(device)
        got = fp8_block_gemm(x, codes, scales).float()
        want = fp8_gemm_reference(x, codes, scales)
        magnitude = quantize_activations(x).dequantize().abs() @ _dequantized(codes, scales).T
        error = ((got - want).abs() / magnitude.clamp_min(1e-30)).max().item()
        results[f"gemm_{rows}x{out}x{inp}"] = {"max_error": error, "ok": error <= FP8_TOLERANCE}
    hidden, inter, counts = experts_shape
    experts = [
        [quantize_weight_blocks(torch.randn(n, k, generator=gen) / k**0.5) for n, k in parts]
        for parts in [[(inter, hidden), (inter, hidden), (hidden, inter)]] * len(counts)
    ]
    w13 = torch.stack([torch.cat([e[0][0].view(torch.uint8), e[1][0].view(torch.uint8)])
                       for e in experts]).view(torch.float8_e4m3fn).to(device)  # fmt: skip
    s13 = torch.stack([torch.cat([e[0][1], e[1][1]]) for e in experts]).to(device)
    w2 = torch.stack([e[2][0] for e in experts]).to(device)
    s2 = torch.stack([e[2][1] for e in experts]).to(device)
    # float32 rows: in bf16 the kernel rounds the activations before quantizing them and a
    # code may land one e4m3 step off the reference's; the end-to-end runs are bf16.
    x = torch.randn(sum(counts), hidden, generator=gen).to(device)
    got = fp8_run_experts(x, counts, w13, s13, w2, s2).float()
    want, magnitude = _experts_reference(x, counts, (w13, s13, w2, s2))
    error = ((got - want).abs() / magnitude.clamp_min(1e-30)).max().item()
    results[f"experts_{len(counts)}x{inter}x{hidden}"] = {
        "max_error": error,
        "ok": error <= FP8_TOLERANCE,
    }
    return results


def _experts_reference(
    x: torch.Tensor, counts: list[int], weights: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the FP8 experts compute, in float32 torch: each expert's rows quantized per 128
    columns, SwiGLU over the dequantized w13, the activations (in ``x``'s dtype) quantized
    again, then the dequantized w2; and ``|x_q| @ |W|^T`` of that last product (the scale)."""
    import torch.nn.functional as F

    from roundgate.kernels.quant.fp8_blocks import quantize_activations
    from roundgate.kernels.quant.triton_fp8_experts import dequantize_experts

    dense13, dense2 = dequantize_experts(*weights)
    out, scale = torch.zeros(x.shape, device=x.device), torch.zeros(x.shape, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        rows = slice(start, start + count)
        start += count
        if count == 0:
            continue
        gate, up = (quantize_activations(x[rows]).dequantize() @ dense13[expert].T).chunk(2, -1)
        act = quantize_activations((F.silu(gate) * up).to(x.dtype)).dequantize()
        out[rows] = act @ dense2[expert].T
        scale[rows] = act.abs() @ dense2[expert].abs().T
    return out, scale


def _dequantized(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    from roundgate.kernels.quant.fp8_blocks import dequantize_weight_blocks

    return dequantize_weight_blocks(codes, scales).abs()


def chosen_backends(device: str = "cuda") -> dict[str, Any]:
    """What ``auto`` picks on this machine, and whether each pick is the fused backend."""
    from roundgate.kernels.selection import resolve_kernels

    mla = resolve_kernels(
        "auto", "auto", "auto", is_mla=True, is_moe=True, expert_world=8, device=device
    )
    gqa = resolve_kernels(
        "auto", "auto", "auto", is_mla=False, is_moe=False, expert_world=1, device=device
    )
    wanted = {
        "mla_attention": (mla.attention, "triton"),
        "moe_kernel": (mla.moe_kernel, "triton"),
        "moe_backend_8_ranks": (mla.moe_backend, "deepep"),
        "gqa_attention": (gqa.attention, "flashinfer"),
    }
    return {
        part: {"auto": got, "fused": want, "ok": got == want}
        for part, (got, want) in wanted.items()
    }


def _failures(report: dict[str, Any]) -> list[str]:
    """Every check of ``report`` whose ``ok`` is false, by path."""
    found = []
    for section in ("fp8_parity", "backends"):
        for name, row in report[section].items():
            if not row["ok"]:
                found.append(f"{section}.{name}: {row}")
    return found


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    ns = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check.py needs a CUDA device")
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "parity": parity(),
        "decode_tokens_per_s": throughput(ns.batch, ns.new_tokens),
        "fp8_parity": fp8_parity(),
        "backends": chosen_backends(),
        "note": "decode tokens/s: tokens generated over one Engine run of the batch, its "
        "prompts already in the prefix cache; bf16",
    }
    failures = _failures(report)
    report["failures"] = failures
    text = json.dumps(report, indent=2)
    print(text)
    if ns.json:
        with open(ns.json, "w") as f:
            f.write(text + "\n")
    if failures:
        raise SystemExit("gpu_check.py FAILED:\n  " + "\n  ".join(failures))


if __name__ == "__main__":
    main()
