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

Prints one JSON document (and writes it to ``--json``). Needs torch with CUDA and triton;
nothing else beyond the project's own packages.
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
        "note": "decode tokens/s: tokens generated over one Engine run of the batch, its "
        "prompts already in the prefix cache; bf16",
    }
    text = json.dumps(report, indent=2)
    print(text)
    if ns.json:
        with open(ns.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
