"""Model configs and weights: presets, config.json parsing, and errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from roundgate.actors.model.config import PRESETS, ModelConfig
from roundgate.actors.model.families import read_hf_config, read_model_dir
from roundgate.actors.model.resolve import resolve_model_config
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.model.weights import hf_param_shapes, random_hf_state, save_hf_dir
from roundgate.actors.server_args import ServerArgs

TINY = ModelConfig(
    vocab_size=32,
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    intermediate_size=24,
    max_position=64,
)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_config_json(name: str) -> None:
    config = PRESETS[name]
    assert read_hf_config(config.to_hf_dict()) == config
    assert config.max_position >= 2048 + 256  # the prefill benchmark fits


def test_preset_weights_are_seeded() -> None:
    a, b, c = (random_hf_state(TINY, seed) for seed in (0, 0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_transformers_4_style_rope_theta_is_read() -> None:
    body = TINY.to_hf_dict()
    del body["rope_parameters"]
    body["rope_theta"] = 5e5
    assert read_hf_config(body).rope_theta == 5e5


def write_dir(path: Path, config: ModelConfig = TINY) -> Path:
    return save_hf_dir(config, random_hf_state(config, 0), path)


def edit_config(path: Path, **changes) -> None:
    body = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    (path / "config.json").write_text(json.dumps(body))


def drop_tensor(path: Path, name: str, reshape: bool = False) -> None:
    state = random_hf_state(TINY, 0)
    if reshape:
        state[name] = state[name][:-1]
    else:
        del state[name]
    save_file(state, str(path / "model.safetensors"))


BAD_DIRS = [
    ("no-dir", lambda d: None, r"neither a preset"),
    ("no-config", lambda d: d.mkdir(), r"config\.json: missing"),
    (
        "bad-json",
        lambda d: (d.mkdir(), (d / "config.json").write_text("{oops")),
        r"config\.json: not valid JSON",
    ),
    (
        "missing-field",
        lambda d: edit_config(write_dir(d), hidden_size=None),
        r"config\.json.*'hidden_size' is missing",
    ),
    (
        "wrong-type",
        lambda d: edit_config(write_dir(d), num_hidden_layers="2"),
        r"config\.json.*'num_hidden_layers' must be int",
    ),
    (
        "arch",
        lambda d: edit_config(write_dir(d), architectures=["GPT2LMHeadModel"]),
        r"config\.json.*GPT2LMHeadModel",
    ),
    (
        "rope",
        lambda d: edit_config(write_dir(d), rope_parameters={"rope_type": "yarn"}),
        r"config\.json.*'yarn'",
    ),
    (
        "heads",
        lambda d: edit_config(write_dir(d), num_key_value_heads=3),
        r"config\.json.*multiple of",
    ),
    (
        "no-weights",
        lambda d: (write_dir(d), (d / "model.safetensors").unlink()),
        r"no \*\.safetensors",
    ),
    (
        "bad-weights",
        lambda d: (write_dir(d), (d / "model.safetensors").write_bytes(b"junk")),
        r"model\.safetensors: unreadable",
    ),
    (
        "missing-tensor",
        lambda d: (write_dir(d), drop_tensor(d, "model.norm.weight")),
        r"tensor 'model\.norm\.weight' is missing",
    ),
    (
        "wrong-shape",
        lambda d: (write_dir(d), drop_tensor(d, "model.layers.0.self_attn.k_proj.weight", True)),
        r"model\.safetensors: tensor 'model\.layers\.0\.self_attn\.k_proj\.weight' has shape",
    ),
]


@pytest.mark.parametrize(
    ("setup", "message"), [b[1:] for b in BAD_DIRS], ids=[b[0] for b in BAD_DIRS]
)
def test_bad_model_dirs_name_the_file(tmp_path: Path, setup, message: str) -> None:
    model_dir = tmp_path / "model"
    setup(model_dir)
    with pytest.raises(ValueError, match=message):
        ModelRunner(ServerArgs(model=str(model_dir), num_kv_pages=4))


def test_a_good_dir_loads(tmp_path: Path) -> None:
    runner = ModelRunner(ServerArgs(model=str(write_dir(tmp_path / "m")), num_kv_pages=4))
    assert runner.config == TINY
    assert set(hf_param_shapes(TINY)) >= {"lm_head.weight", "model.norm.weight"}


def test_max_model_len_beyond_the_model_is_refused() -> None:
    with pytest.raises(ValueError, match="--max-model-len 9999 exceeds"):
        ModelRunner(ServerArgs(model="tiny-llama", max_model_len=9999, num_kv_pages=4))


def test_resolve_reads_presets_without_touching_disk() -> None:
    assert resolve_model_config("tiny-moe").is_moe
    assert not resolve_model_config("tiny-llama").is_moe


def test_fused_expert_names_load_like_per_expert_names(tmp_path: Path) -> None:
    """transformers 5's in-memory Mixtral names (fused experts) give the same model."""
    import transformers

    from roundgate.actors.model.decoder import build_model
    from roundgate.actors.model.weights import DictSource, SafetensorsSource
    from roundgate.kernels.moe.placement import ExpertPlacement

    torch.manual_seed(0)
    hf = transformers.MixtralForCausalLM(
        transformers.MixtralConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_local_experts=4,
            num_experts_per_tok=2,
        )
    )
    hf.save_pretrained(tmp_path)  # per-expert w1/w2/w3 names on disk
    config = read_model_dir(tmp_path)
    for rank in (0, 1):  # and each rank of a 2-way split reads only its own experts
        place = ExpertPlacement(4, 2, rank)
        fused = build_model(config, DictSource(hf.state_dict(), "memory"), place)
        legacy = build_model(config, SafetensorsSource(tmp_path), place)
        for (name, a), (_, b) in zip(
            fused.state_dict().items(), legacy.state_dict().items(), strict=True
        ):
            assert torch.equal(a, b), name
