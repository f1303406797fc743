"""Ops per decode layer and host reads per round of a DeepSeek-V3-shaped model, per path.

    .venv/bin/python benchmarks/op_budget.py [--batches 1 16 64] [--out op_budget.json]

A random DeepSeek-V3-shaped model (transformers' class: MLA with q-LoRA, a dense first
layer, then shared + grouped-routed experts; small widths, 3 layers) is decoded in the
offline engine on CPU, Triton kernels under the interpreter. For each batch size the first
steady decode round is counted (``kernels/dispatch_count.py``): torch ops that reach the
dispatcher plus Triton launches, per decoder layer, and every ``item``/``tolist``/``bool`` of a
tensor (a device sync on a GPU), on three paths:

    reference       torch attention, per-expert GEMM loop (the CPU default)
    triton          Triton attention and experts, the fused path switched off (before)
    fused           the fused decode path (what ``auto`` runs on CUDA)

The counts do not depend on the widths, only on the structure, so they are DeepSeek-V3's
per layer; the host time they cost is a GPU measurement (``benchmarks/gpu_check.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import torch

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.model.fused_path import FusedPath
from roundgate.actors.server_args import ServerArgs
from roundgate.kernels.dispatch_count import count_decode_round

SHAPE = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 12,
    "v_head_dim": 10,
    "moe_intermediate_size": 32,
    "num_experts_per_tok": 2,
    "n_routed_experts": 8,
    "n_group": 4,
    "topk_group": 2,
    "first_k_dense_replace": 1,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
}
PATHS = {
    "reference": {},
    "triton": {"attention_backend": "triton", "moe_kernel": "triton"},
    "fused": {"attention_backend": "triton", "moe_kernel": "triton"},
}


def save_model(path: str) -> None:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**SHAPE)).eval()
    with torch.no_grad():  # zero at init; random so the routing depends on it
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.5)
    model.save_pretrained(path)


def count(path: str, name: str, batch: int) -> dict[str, Any]:
    args = ServerArgs(
        model=path,
        device="cpu",
        page_size=4,
        num_kv_pages=8 * batch + 16,
        max_num_seqs=max(batch, 8),
        **PATHS[name],
    )
    engine = Engine(args)
    if name == "triton":
        engine.runner.fused = FusedPath()
    prompts = [[5 + i % 200, 7, 9, 11] for i in range(batch)]
    tally = count_decode_round(
        engine.runner, lambda: engine.generate(prompts, SamplingParams(max_tokens=3)), batch
    )
    layers = tally.layer_ops()
    return {
        "path": name,
        "batch": batch,
        "ops_per_layer": layers,
        "max_ops_per_layer": max(layers.values()),
        "outside_layer_ops": tally.outside_ops,
        "host_reads_per_round": tally.num_host_reads,
        "host_reads_in_layers": sum(tally.layer_reads.values()) - tally.layer_reads["outside"],
        "host_read_sites": dict(tally.host_reads),
        "launches": dict(tally.kernels),
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--out", default=None)
    ns = parser.parse_args(argv)
    torch.set_num_threads(1)
    records = []
    with tempfile.TemporaryDirectory() as path:
        save_model(path)
        for batch in ns.batches:
            for name in PATHS:
                record = count(path, name, batch)
                records.append(record)
                print(
                    f"batch {batch:3d} {name:9s} ops/layer {record['ops_per_layer']} "
                    f"(outside layers {record['outside_layer_ops']}), host reads/round "
                    f"{record['host_reads_per_round']} ({record['host_reads_in_layers']} in "
                    "layers)",
                    flush=True,
                )
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
