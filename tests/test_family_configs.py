"""Config reading for the new families: what is refused (at build_app, naming the field) and
the KV bytes per token each architecture implies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from family_models import build_family

from roundgate.actors.model.families import read_model_dir
from roundgate.actors.server_args import ServerArgs


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory):
    """Saved tiny Qwen2 and DeepSeek-V3 directories; each test edits a copy's config."""
    dirs = {}
    for name in ("qwen2", "deepseek_v3", "deepseek_v2"):
        path = tmp_path_factory.mktemp(name)
        build_family(name).save_pretrained(path)
        dirs[name] = path
    return dirs


def edited(src: Path, dst: Path, **changes: object) -> str:
    dst.mkdir()
    body = json.loads((src / "config.json").read_text())
    body.update(changes)
    (dst / "config.json").write_text(json.dumps(body))
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    return str(dst)


REFUSED = [
    ("qwen2", {"architectures": ["Qwen2VLForConditionalGeneration"]}, "Qwen2VLForCond"),
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
    ("qwen2", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("qwen2", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "longrope"),
    ("deepseek_v3", {"scoring_func": "softmax"}, "scoring_func 'softmax'"),
    ("deepseek_v3", {"topk_method": "greedy"}, "topk_method 'greedy'"),
    ("deepseek_v3", {"n_group": 3}, "n_group"),
    ("deepseek_v3", {"attention_bias": True}, "attention_bias"),
    ("deepseek_v2", {"norm_topk_prob": True}, "norm_topk_prob"),
    ("deepseek_v3", {"quantization_config": {"quant_method": "awq"}}, "quant_method 'awq'"),
    (
        "deepseek_v3",
        {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}},
        "weight_block_size",
    ),
]


@pytest.mark.parametrize(("family", "changes", "named"), REFUSED, ids=[r[2] for r in REFUSED])
def test_build_app_refuses_naming_the_field(
    saved, tmp_path: Path, family: str, changes: dict, named: str
) -> None:
    """The driver refuses before any replica exists (``build_app`` binds nothing on error)."""
    from roundgate.deployment.app import build_app

    path = edited(saved[family], tmp_path / "m", **changes)
    with pytest.raises(ValueError, match=named):
        build_app({"model": path, "dp_size": 2})


def test_build_app_accepts_a_new_family(saved) -> None:
    from roundgate.deployment.app import build_app

    assert build_app({"model": str(saved["deepseek_v3"]), "dp_size": 2}) is not None


def test_mla_kv_bytes_per_token_is_the_latent(saved) -> None:
    config = ServerArgs(model=str(saved["deepseek_v3"])).model_config
    mla = config.mla
    assert config.kv_bytes_per_token(2) == (mla.kv_lora_rank + mla.qk_rope_head_dim) * 3 * 2
    assert config.kv_bytes_per_token(4) == (16 + 8) * config.num_layers * 4


def test_gqa_kv_bytes_per_token_counts_k_and_v(saved) -> None:
    config = read_model_dir(saved["qwen2"])
    assert config.kv_bytes_per_token(4) == 2 * 2 * 16 * config.num_layers * 4


def test_the_allocated_latent_cache_is_what_the_formula_says(saved) -> None:
    from model_driver import make_runner

    runner = make_runner(str(saved["deepseek_v3"]), num_pages=8)
    assert runner.cache.v == []  # no per-head V, no per-head K: the latent alone
    # 8 pages for the pool plus the scratch page decode graphs pad into (never handed out).
    assert runner.cache.k[0].shape == (8 + 1, 4, 1, 16 + 8)
    assert runner.cache.bytes_per_token == runner.config.kv_bytes_per_token(4)


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ({"kv_cache_memory_gb": 1.0}, "needs --device cpu or cuda"),
        ({"kv_cache_memory_gb": 0, "device": "cpu"}, "must be a number > 0"),
        ({"kv_cache_memory_gb": 1e-9, "device": "cpu"}, "holds no page"),
        ({"gpu_memory_utilization": 0.9, "device": "cpu"}, "--device cuda only"),
        ({"gpu_memory_utilization": 1.5, "device": "cuda"}, r"in \(0, 1\]"),
        ({"gpu_memory_utilization": 0.5, "kv_cache_memory_gb": 1.0}, "exclude each other"),
    ],
)
def test_bad_kv_budget_flags_are_named(saved, flags: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ServerArgs(model=str(saved["deepseek_v3"]), **flags)


def test_the_kv_budget_sizes_the_pool_from_the_latent(
    saved, caplog: pytest.LogCaptureFixture
) -> None:
    """1 MiB of float32 latent (24 values x 3 layers x 4 B = 288 B/token) in 4-token pages."""
    import logging

    from roundgate.actors.engine import Engine

    args = ServerArgs(
        model=str(saved["deepseek_v3"]), device="cpu", page_size=4, kv_cache_memory_gb=2**-10
    )
    assert args.num_kv_pages == 2**20 // (288 * 4)
    with caplog.at_level(logging.INFO, logger="roundgate.actors.model.kv_cache"):
        engine = Engine(args)
    assert engine.core.scheduler.pool.num_pages == 910
    assert engine.runner.cache.num_pages == 910 + 1  # the decode graphs' scratch page
    assert f"{910 * 4} max concurrent tokens" in caplog.text


def test_routers_stay_float32_in_a_bf16_model(saved) -> None:
    """Expert choice is computed from float32 router weights whatever the runtime dtype."""
    import torch

    from roundgate.actors.model.decoder import build_model
    from roundgate.actors.model.weights import SafetensorsSource

    path = saved["deepseek_v3"]
    config = read_model_dir(path)
    full = build_model(config, SafetensorsSource(path))
    half = build_model(config, SafetensorsSource(path), dtype=torch.bfloat16)
    gate, half_gate = full.layers[1].mlp.gate, half.layers[1].mlp.gate
    assert half.layers[1].mlp.w13.dtype == torch.bfloat16
    assert half_gate.weight.dtype == half_gate.e_score_correction_bias.dtype == torch.float32
    assert torch.equal(half_gate.weight, gate.weight)
    assert torch.equal(half_gate.e_score_correction_bias, gate.e_score_correction_bias)


def test_a_qwen3_labelled_llama_is_refused_not_loaded_without_its_norms(tmp_path: Path) -> None:
    """The weights have q/k norms a Llama has no place for: loading says so, naming one."""
    from model_driver import make_runner

    build_family("qwen3").save_pretrained(tmp_path)
    body = json.loads((tmp_path / "config.json").read_text())
    body.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (tmp_path / "config.json").write_text(json.dumps(body))
    with pytest.raises(ValueError, match=r"[qk]_norm.weight.* not part of LlamaForCausalLM"):
        make_runner(str(tmp_path), num_pages=8)
