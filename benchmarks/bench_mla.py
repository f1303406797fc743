"""DeepSeek-V3 (MLA) decode throughput, engine vs transformers, and the latent KV saving.

    .venv/bin/python benchmarks/bench_mla.py [--batch-sizes 8 32] [--new-tokens 32]
        [any other benchmarks/bench_model.py flag]

Builds a small random ``DeepseekV3ForCausalLM`` (q-LoRA, YaRN, grouped sigmoid routing, a
dense first layer, a shared expert) with transformers, saves it, prints the KV bytes per
token of the engine's latent cache against per-head K/V (for this config and for the real
DeepSeek-V3 shape), then runs ``bench_model.py`` on the saved directory: decode tokens/s of
ModelRunner (latent cache, absorbed decode) vs transformers' own class, per batch size.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from roundgate.actors.model.config import ModelConfig
from roundgate.actors.model.families import read_model_dir

SHAPE = {
    "vocab_size": 4096,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": 192,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_group": 4,
    "topk_group": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 4096,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "bos_token_id": None,
    "eos_token_id": None,
}
# The published DeepSeek-V3 shape, for the KV arithmetic only.
V3 = {"layers": 61, "heads": 128, "kv_lora_rank": 512, "rope": 64, "nope": 128, "v": 128}


def kv_report(config: ModelConfig) -> None:
    mla = config.mla
    latent = config.kv_bytes_per_token(2)
    expanded = config.num_heads * (mla.qk_head_dim + mla.v_head_dim) * config.num_layers * 2
    print(
        f"KV bytes/token (bf16), this config: latent {latent:,}, per-head K/V {expanded:,}, "
        f"ratio {expanded / latent:.1f}x"
    )
    latent = (V3["kv_lora_rank"] + V3["rope"]) * V3["layers"] * 2
    expanded = V3["heads"] * (V3["nope"] + V3["rope"] + V3["v"]) * V3["layers"] * 2
    print(
        f"KV bytes/token (bf16), DeepSeek-V3: latent {latent:,}, per-head K/V {expanded:,}, "
        f"ratio {expanded / latent:.1f}x"
    )


def main(argv: list[str]) -> None:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**SHAPE)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        del model
        kv_report(read_model_dir(tmp))
        defaults = ["--batch-sizes", "8", "32", "--new-tokens", "32", "--prefill-len", "512"]
        # The model benchmark itself, as its own process, on the saved directory.
        bench_model = Path(__file__).with_name("bench_model.py")
        command = [sys.executable, str(bench_model), "--model", tmp, *defaults, *argv]
        subprocess.run(command, check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
