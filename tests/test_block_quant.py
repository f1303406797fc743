"""GGUF block-quantized linear layers: the kernel against the dequantized reference, the
file's Q4_1/Q8_0 blocks against the gguf package's dequantization, and the default model's
greedy tokens with packed weights equal to those with float32 weights."""

from __future__ import annotations

import pytest
import torch

from actors.engine import Engine, SamplingParams
from actors.model import gguf_blocks, gguf_file
from actors.model.gguf_blocks import pack_gguf, read_blocks
from actors.model.gguf_source import GGUFSource
from actors.model.runner import ModelRunner
from actors.server_args import ServerArgs
from kernels import quant
from kernels.quant import BlockLinear, BlockWeights, block_linear

pytestmark = pytest.mark.skipif(not quant.cpu_supports_kernel(), reason="needs AVX2 + FMA")
MODEL = "smollm2-135m-instruct"


def random_blocks(n: int, k: int, offset: bool, seed: int = 0) -> BlockWeights:
    gen = torch.Generator().manual_seed(seed)
    if offset:  # Q4_1-like: 0..15 with a per-block offset
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int8)
        off = torch.rand(n, k // 32, generator=gen) - 0.5
    else:  # Q8_0-like: symmetric int8
        q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        off = None
    return BlockWeights(q, torch.rand(n, k // 32, generator=gen) * 0.02, off)


# Rows cover the per-row kernel (1-5, with a tile remainder), the panel kernel (6 and up,
# odd counts) and the dequantize-then-GEMM path above GEMM_ROWS; 97 output rows leave a
# panel remainder.
@pytest.mark.parametrize("offset", [True, False])
@pytest.mark.parametrize("rows", [1, 3, 5, 6, 7, 8, 17, 32, quant.GEMM_ROWS + 1])
def test_the_kernel_equals_the_dequantized_matmul(rows: int, offset: bool) -> None:
    assert quant.kernel() is not None, quant.kernel_failure()
    weights = random_blocks(97, 160, offset)
    x = torch.randn(rows, 160, generator=torch.Generator().manual_seed(rows))
    expected = x @ weights.dequantize().T
    torch.testing.assert_close(block_linear(x, weights), expected, rtol=1e-5, atol=1e-5)


def test_block_linear_keeps_leading_dims_and_refuses_a_wrong_width() -> None:
    weights = random_blocks(8, 64, True)
    layer = BlockLinear(weights)
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(layer(x), x @ weights.dequantize().T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="32 columns"):
        block_linear(torch.randn(1, 32), weights)


def test_cat_stacks_rows_and_fills_a_missing_offset() -> None:
    a, b = random_blocks(4, 64, True, 1), random_blocks(3, 64, False, 2)
    both = BlockWeights.cat([a, b])
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


@pytest.fixture(scope="module")
def source() -> GGUFSource:
    path = gguf_file.packaged_path(MODEL)
    return GGUFSource(path, gguf_file.read_config(path))


@pytest.mark.parametrize(
    "name",
    [
        "model.embed_tokens.weight",  # Q8_0
        "model.layers.0.self_attn.q_proj.weight",  # Q4_1, rows un-permuted
        "model.layers.3.self_attn.k_proj.weight",
        "model.layers.7.mlp.down_proj.weight",
    ],
)
def test_the_files_blocks_dequantize_to_what_the_float_loader_reads(
    source: GGUFSource, name: str
) -> None:
    blocks = read_blocks(source, name)
    assert blocks is not None
    expected = source.get(name, blocks.shape)
    assert torch.equal(blocks.dequantize(), expected)


def test_a_float32_tensor_has_no_blocks(source: GGUFSource) -> None:
    assert read_blocks(source, "model.norm.weight") is None


def test_packed_and_float_weights_give_the_same_greedy_tokens() -> None:
    torch.set_num_threads(1)
    base = {"model": MODEL, "device": "cpu", "num_kv_pages": 64, "max_num_seqs": 4}
    prompts = [[504, 3575, 282, 4649, 314], [1178, 28560, 19, 92, 2730], [18455, 2067]]
    greedy = SamplingParams(max_tokens=16)
    packed = Engine(ServerArgs(**base))
    assert sum(isinstance(m, BlockLinear) for m in packed.runner.model.modules()) == 121
    floats = Engine(ServerArgs(gguf_weights="float", **base))
    assert not any(isinstance(m, BlockLinear) for m in floats.runner.model.modules())
    assert packed.generate(prompts, greedy) == floats.generate(prompts, greedy)


def test_without_the_kernel_the_weights_stay_float(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_blocks, "kernel", lambda: None)
    runner = ModelRunner(ServerArgs(model=MODEL, device="cpu", num_kv_pages=8))
    assert not any(isinstance(m, BlockLinear) for m in runner.model.modules())


def test_a_non_gguf_model_is_left_alone() -> None:
    runner = ModelRunner(ServerArgs(model="tiny-llama", device="cpu", num_kv_pages=8))
    assert pack_gguf(runner.model, object(), tied=False) == 0


def test_a_bad_gguf_weights_value_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"gguf.weights"):
        ServerArgs(gguf_weights="int3")
