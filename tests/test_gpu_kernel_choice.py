"""What every shipped GPU config runs on CUDA, asked on this CPU: each config (``deployment/
configs/gpu*.yaml`` and the k8s H200 overlays) validates offline with its model's real
``config.json`` standing in for the weights, and its kernel flags resolve, on a stand-in CUDA
device with the image's packages, to the fused backends: the Triton MLA kernel, the Triton
fused-MoE experts, DeepEP for dispatch, and FP8 weights kept FP8 for DeepSeek-V3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from roundgate.actors.model.fp8 import keeps_fp8
from roundgate.actors.server_args import ServerArgs
from roundgate.deployment.config import AppArgs
from roundgate.kernels.selection import KernelChoice, resolve_kernels

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "deployment" / "configs"
OVERLAYS = REPO / "k8s" / "overlays"
GPU_CONFIGS = sorted(CONFIGS.glob("gpu*.yaml"))
K8S_CONFIGS = sorted(OVERLAYS.glob("h200-*/serve/serve-config.yaml"))

# The two models the GPU configs name, as their Hugging Face config.json gives them.
YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1}  # fmt: skip
MLA = {"num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512,
       "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
       "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
       "tie_word_embeddings": False, "hidden_act": "silu"}  # fmt: skip
HF_CONFIGS: dict[str, dict[str, Any]] = {
    "DeepSeek-V3": {
        **MLA, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "num_hidden_layers": 61, "n_shared_experts": 1,
        "n_routed_experts": 256, "routed_scaling_factor": 2.5, "topk_method": "noaux_tc",
        "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "moe_layer_freq": 1, "norm_topk_prob": True, "scoring_func": "sigmoid",
        "num_nextn_predict_layers": 1, "bos_token_id": 0, "eos_token_id": 1,
        "rope_scaling": {**YARN, "mscale": 1.0, "mscale_all_dim": 1.0},
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                "quant_method": "fp8", "weight_block_size": [128, 128]},
    },
    "DeepSeek-V2-Chat-0628": {
        **MLA, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "vocab_size": 102400, "hidden_size": 5120, "intermediate_size": 12288,
        "moe_intermediate_size": 1536, "num_hidden_layers": 60, "n_shared_experts": 2,
        "n_routed_experts": 160, "routed_scaling_factor": 16.0,
        "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3,
        "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "norm_topk_prob": False, "scoring_func": "softmax", "bos_token_id": 100000,
        "eos_token_id": 100001,
        "rope_scaling": {**YARN, "mscale": 0.707, "mscale_all_dim": 0.707},
    },
}  # fmt: skip
FUSED_MOE = KernelChoice(attention="triton", moe_backend="deepep", moe_kernel="triton")


def app_args(path: Path) -> dict[str, Any]:
    """The one application's ``args`` of a serve config, or of a k8s overlay's patch."""
    data = yaml.safe_load(path.read_text())
    if isinstance(data, list):  # JSON6902 patches: the serveConfigV2 one holds the config
        (patch,) = [p for p in data if p["path"] == "/spec/serveConfigV2"]
        data = yaml.safe_load(patch["value"])
    (app,) = data["applications"]
    return dict(app["args"])


def with_local_model(args: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """``args`` with the model's directory replaced by one holding only its config.json."""
    name = Path(args["model"]).name
    model = tmp_path / name
    model.mkdir()
    (model / "config.json").write_text(json.dumps(HF_CONFIGS[name]))
    return {**args, "model": str(model)}


def engine_args(args: dict[str, Any]) -> list[ServerArgs]:
    """Every ``ServerArgs`` a config deploys (one per role of a P/D config)."""
    app = AppArgs.of(args)
    if app.is_pd:
        return [app.role_args(role) for role in ("prefill", "decode")]
    return [app.server_args()]


def choice(args: ServerArgs, installed: bool = True) -> KernelChoice:
    """What ``args`` resolves to on a stand-in CUDA device; ``installed``: the image's
    packages (triton, deep_ep, flashinfer) importable or none of them."""
    config = args.model_config
    return resolve_kernels(
        args.attention_backend,
        args.moe_backend,
        args.moe_kernel,
        is_mla=config.mla is not None,
        is_moe=config.is_moe,
        expert_world=args.dp_size,
        device="cuda",
        available=lambda module: installed,
    )


SHIPPED = [*GPU_CONFIGS, *K8S_CONFIGS]


def test_the_gpu_configs_are_found() -> None:
    names = {p.name for p in GPU_CONFIGS} | {p.parts[-3] for p in K8S_CONFIGS}
    assert {"gpu.yaml", "gpu-deepseek-v3.yaml", "h200-dp8", "h200-pd"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_each_gpu_config_resolves_to_the_fused_backends(path: Path, tmp_path: Path) -> None:
    for args in engine_args(with_local_model(app_args(path), tmp_path)):
        assert args.device == "cuda"
        assert args.model_config.mla is not None and args.model_config.is_moe
        assert choice(args) == FUSED_MOE
        # Without the optional packages the same flags fall back, never fail to start.
        assert choice(args, installed=False) == KernelChoice("torch", "torch", "torch")
        block = args.model_config.weight_block_size
        if block is not None:  # DeepSeek-V3: FP8 kept FP8 on CUDA, dequantized on CPU
            assert keeps_fp8(args.fp8_weights, "cuda", block)
            assert not keeps_fp8(args.fp8_weights, "cpu", block)


def test_the_deepseek_v3_config_serves_its_fp8_checkpoint(tmp_path: Path) -> None:
    args = with_local_model(app_args(CONFIGS / "gpu-deepseek-v3.yaml"), tmp_path)
    (server,) = engine_args(args)
    config = server.model_config
    assert config.weight_block_size == (128, 128) and config.num_experts == 256
    assert server.dp_size == 8 and 256 % server.dp_size == 0
    assert config.kv_bytes_per_token(2) == 70272  # the header's arithmetic
    assert server.num_kv_pages == 4774


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_each_gpu_config_validates_offline_as_shipped(path: Path) -> None:
    """The model path missing here, a preset stands in (``k8s/tools/serve_config``)."""
    from roundgate.k8s.tools.serve_config import check_app_args

    assert check_app_args(app_args(path), str(path.name)) == []
