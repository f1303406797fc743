"""Config reading for the new families: what is refused (at build_app, naming the field) and
the KV bytes per token each architecture implies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from family_models import build_family

from actors.model.config import ModelConfig
from actors.server_args import ServerArgs

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory):
    """Saved tiny Qwen2 and DeepSeek-V3 directories; each test edits a copy's config."""
    dirs = {}
    for name in ("qwen2", "deepseek_v3"):
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
    from deployment.app import build_app

    path = edited(saved[family], tmp_path / "m", **changes)
    with pytest.raises(ValueError, match=named):
        build_app({"model": path, "dp_size": 2})


def test_build_app_accepts_a_new_family(saved) -> None:
    from deployment.app import build_app

    assert build_app({"model": str(saved["deepseek_v3"]), "dp_size": 2}) is not None


def test_mla_kv_bytes_per_token_is_the_latent(saved) -> None:
    config = ServerArgs(model=str(saved["deepseek_v3"])).model_config
    mla = config.mla
    assert config.kv_bytes_per_token(2) == (mla.kv_lora_rank + mla.qk_rope_head_dim) * 3 * 2
    assert config.kv_bytes_per_token(4) == (16 + 8) * config.num_layers * 4


def test_gqa_kv_bytes_per_token_counts_k_and_v(saved) -> None:
    config = ModelConfig.from_dir(saved["qwen2"])
    assert config.kv_bytes_per_token(4) == 2 * 2 * 16 * config.num_layers * 4


def test_the_allocated_latent_cache_is_what_the_formula_says(saved) -> None:
    from model_driver import make_runner

    runner = make_runner(str(saved["deepseek_v3"]), num_pages=8)
    assert runner.cache.v == []  # no per-head V, no per-head K: the latent alone
    assert runner.cache.k[0].shape == (8, 4, 1, 16 + 8)
    assert runner.cache.bytes_per_token == runner.config.kv_bytes_per_token(4)
