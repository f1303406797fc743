"""The packed GGUF weights' check at load: a mapping that does not fit the file's rows (here
Q/K rows left permuted) keeps those layers float32, while the right mapping packs them all."""

from __future__ import annotations

import pytest
from torch import nn

from roundgate.actors.model import gguf_blocks, gguf_file
from roundgate.actors.model.gguf_source import GGUFSource
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.server_args import ServerArgs
from roundgate.kernels.quant import BlockLinear, kernel

MODEL = "smollm2-135m-instruct"


def float_model() -> nn.Module:
    args = ServerArgs(model=MODEL, device="cpu", num_kv_pages=8, gguf_weights="float")
    return ModelRunner(args).model


@pytest.fixture(scope="module")
def source() -> GGUFSource:
    path = gguf_file.packaged_path(MODEL)
    return GGUFSource(path, gguf_file.read_config(path))


def packed_paths(model: nn.Module) -> set[str]:
    return {name for name, m in model.named_modules() if isinstance(m, BlockLinear)}


def test_the_right_mapping_packs_every_linear_layer(source: GGUFSource) -> None:
    if kernel() is None:
        pytest.skip("the block kernel cannot be built here")
    model = float_model()
    assert gguf_blocks.pack_gguf(model, source, tied=True) == 121


def test_q_and_k_rows_left_permuted_keep_those_layers_float(
    source: GGUFSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kernel() is None:
        pytest.skip("the block kernel cannot be built here")
    monkeypatch.setattr(gguf_blocks, "unpermute", lambda raw, heads: raw)
    model = float_model()
    assert gguf_blocks.pack_gguf(model, source, tied=True) == 121 - 30
    packed = packed_paths(model)
    assert not any(p.endswith("qkv_proj") for p in packed)
    assert sum(p.endswith("gate_up_proj") for p in packed) == 30


def test_the_checked_rows_cover_every_part_and_its_ends() -> None:
    rows = gguf_blocks._check_rows([576, 192, 192]).tolist()
    assert {0, 575, 576, 767, 768, 959} <= set(rows)
    assert rows == sorted(set(rows)) and max(rows) == 959
    assert len(rows) >= 64
