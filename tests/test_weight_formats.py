"""Checkpoint formats: sharded safetensors with an index, and FP8 block-scaled weights
(DeepSeek-V3's format) dequantized at load, each made in the test from a tiny model."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
import torch
from family_models import build_family
from model_driver import grow_pages, make_requests, make_runner
from safetensors.torch import load_file, save_file

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.round import RoundPlan, ScheduledChunk
from roundgate.actors.model.weights import SafetensorsSource

PROMPTS = [[5, 7, 9], list(range(20, 37)), [250, 11, 42, 42, 7, 8]]
FP8_MAX = 448.0  # the largest e4m3 value


def prefill_logits(path: str) -> torch.Tensor:
    runner, pool = make_runner(path), KVPool(PoolConfig(64, 4))
    requests = make_requests(PROMPTS)
    for r in requests:
        grow_pages(pool, r, r.num_tokens)
    return runner.forward(
        RoundPlan(chunks=[ScheduledChunk(r, 0, r.num_tokens, True) for r in requests])
    )


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("deepseek-v3")
    build_family("deepseek_v3").save_pretrained(path)
    return path


def test_a_two_shard_checkpoint_loads(deepseek_dir: Path, tmp_path: Path) -> None:
    build_family("deepseek_v3").save_pretrained(tmp_path, max_shard_size="200KB")
    index = json.loads((tmp_path / SafetensorsSource.INDEX).read_text())
    assert len(set(index["weight_map"].values())) >= 2
    torch.testing.assert_close(prefill_logits(str(tmp_path)), prefill_logits(str(deepseek_dir)))


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    build_family("qwen2").save_pretrained(tmp_path, max_shard_size="100KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ValueError, match=f"shard {shard.name} is missing"):
        make_runner(str(tmp_path))


def quantize_blocks(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """``(fp8 weight, scale_inv, its dequantized twin)`` — the twin computed block by block."""
    rows, cols = weight.shape
    grid = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    scale = torch.empty(grid)
    fp8 = torch.empty(weight.shape, dtype=torch.float8_e4m3fn)
    twin = torch.empty(weight.shape)
    for i in range(grid[0]):
        for j in range(grid[1]):
            part = (
                slice(i * block[0], (i + 1) * block[0]),
                slice(j * block[1], (j + 1) * block[1]),
            )
            scale[i, j] = weight[part].abs().max() / FP8_MAX
            fp8[part] = (weight[part] / scale[i, j]).to(torch.float8_e4m3fn)
            twin[part] = fp8[part].float() * scale[i, j]
    return fp8, scale, twin


@pytest.mark.parametrize("block", [(16, 16), (128, 128)], ids=["16x16-partial", "128x128"])
def test_fp8_block_scaled_equals_its_dequantized_twin(
    deepseek_dir: Path, tmp_path: Path, block: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    state = load_file(str(deepseek_dir / "model.safetensors"))
    fp8_state, twin_state = {}, {}
    for name, tensor in state.items():
        # DeepSeek-V3 quantizes its linear weights; norms, embeddings and routers stay high.
        if name.endswith("proj.weight") or name.endswith("mqa.weight"):
            fp8, scale, twin = quantize_blocks(tensor, block)
            fp8_state[name], fp8_state[name + "_scale_inv"] = fp8, scale
            twin_state[name] = twin
        else:
            fp8_state[name] = twin_state[name] = tensor
    config = json.loads((deepseek_dir / "config.json").read_text())
    for kind, weights in (("fp8", fp8_state), ("twin", twin_state)):
        (tmp_path / kind).mkdir()
        save_file(weights, str(tmp_path / kind / "model.safetensors"))
    shutil.copy(deepseek_dir / "config.json", tmp_path / "twin" / "config.json")
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(block)}
    (tmp_path / "fp8" / "config.json").write_text(
        json.dumps({**config, "quantization_config": quant})
    )
    with caplog.at_level(logging.INFO, logger="roundgate.actors.model.fp8"):
        fp8_logits = prefill_logits(str(tmp_path / "fp8"))
    assert "dequantized at load" in caplog.text
    torch.testing.assert_close(
        fp8_logits, prefill_logits(str(tmp_path / "twin")), atol=1e-5, rtol=0
    )
    # The quantization is real: the FP8 model is not the original one.
    assert not torch.allclose(fp8_logits, prefill_logits(str(deepseek_dir)), atol=1e-5)


def test_fp8_without_its_scale_is_named(deepseek_dir: Path, tmp_path: Path) -> None:
    state = load_file(str(deepseek_dir / "model.safetensors"))
    name = "model.layers.0.self_attn.o_proj.weight"
    state[name] = state[name].to(torch.float8_e4m3fn)
    save_file(state, str(tmp_path / "model.safetensors"))
    config = json.loads((deepseek_dir / "config.json").read_text())
    quant = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    with pytest.raises(ValueError, match=f"{name}_scale_inv"):
        make_runner(str(tmp_path))
