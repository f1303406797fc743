"""GGUF block-quantized linear layers: the kernel's exact product against the dequantized
float32 one and its int8-dot product against llama.cpp's arithmetic (written out here in
numpy), on random raw blocks of every packed type; the file's blocks against the gguf package's
dequantization; and the default model's greedy tokens with packed weights equal to those with
float32 weights."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.model import gguf_blocks, gguf_file
from roundgate.actors.model.gguf_blocks import (
    decode_weight_bytes,
    pack_gguf,
    read_blocks,
    weight_path,
)
from roundgate.actors.model.gguf_source import GGUFSource
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.server_args import ServerArgs
from roundgate.kernels import quant
from roundgate.kernels.quant import FORMATS, BlockLinear, BlockWeights, block_linear

pytestmark = pytest.mark.skipif(not quant.cpu_supports_kernel(), reason="needs AVX2/FMA/F16C")
MODEL = "smollm2-135m-instruct"


def random_raw_blocks(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """``n`` rows of ``k / 32`` random GGUF blocks of ``kind`` (finite f16 scales, any quants)."""
    fmt, rng = FORMATS[kind], np.random.default_rng(seed)
    blocks = np.zeros((n, k // 32, fmt.block_bytes), np.uint8)
    blocks[..., 0:2] = (rng.random((n, k // 32, 1)) * 0.02).astype(np.float16).view(np.uint8)
    start = 2
    if fmt.has_offset:
        offsets = (rng.random((n, k // 32, 1)) - 0.5) * 0.2
        blocks[..., 2:4] = offsets.astype(np.float16).view(np.uint8)
        start = 4
    if kind == "Q8_0":  # llama.cpp's quantizer never writes -128
        quants = rng.integers(-127, 128, (n, k // 32, 32)).astype(np.int8).view(np.uint8)
    else:
        quants = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
    blocks[..., start:] = quants
    return blocks.reshape(n, -1)


def random_blocks(kind: str, n: int, k: int, seed: int = 0) -> BlockWeights:
    return BlockWeights(torch.from_numpy(random_raw_blocks(kind, n, k, seed)), FORMATS[kind], k)


def llamacpp_product(x: np.ndarray, raw: np.ndarray, kind: str) -> np.ndarray:
    """llama.cpp's ``x @ W^T`` on the CPU: x quantized per block to Q8_0 (Q8_1 against Q4_1:
    also the f16 scaled block sum), integer block dots scaled by the product of the scales."""
    rows, k = x.shape
    blocks = x.reshape(rows, k // 32, 32).astype(np.float32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax != 0)
    xq = np.rint(blocks * inv).astype(np.int64)
    d = amax / np.float32(127)
    dx = d.astype(np.float16).astype(np.float32)[..., 0]  # [rows, nb]
    sx = (d[..., 0] * xq.sum(-1).astype(np.float32)).astype(np.float16).astype(np.float32)
    fmt = FORMATS[kind]
    n = raw.shape[0]
    wb = raw.reshape(n, k // 32, fmt.block_bytes)
    dw = wb[..., 0:2].copy().view(np.float16).astype(np.float32)[..., 0]  # [n, nb]
    if kind == "Q8_0":
        qw = wb[..., 2:].copy().view(np.int8).astype(np.int64)
    else:
        qs = wb[..., 4:] if fmt.has_offset else wb[..., 2:]
        qw = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int64)
        if not fmt.has_offset:
            qw -= 8
    dots = np.einsum("rjk,njk->rnj", xq, qw).astype(np.float32)  # exact integers
    y = (dots * (dx[:, None, :] * dw[None])).sum(-1)
    if fmt.has_offset:
        m = wb[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0]
        y = y + (m[None] * sx[:, None, :]).sum(-1)
    return y


@pytest.mark.parametrize("kind", list(FORMATS))
def test_blocks_dequantize_as_the_gguf_package_does(kind: str) -> None:
    raw = random_raw_blocks(kind, 5, 96)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    weights = BlockWeights(torch.from_numpy(raw), FORMATS[kind], 96)
    assert np.array_equal(weights.dequantize().numpy(), expected)
    assert torch.equal(quant.dequantize_fast(weights), weights.dequantize())


# Rows cover the one-row kernel, the panel kernel (2 and up: tiles of 3 and remainders 1-2)
# and the dequantize-then-GEMM path above GEMM_ROWS; 97 output rows by 160 inputs (5 blocks)
# leave a panel remainder, one row of one block is the smallest weight there is, 1536 inputs
# are the default model's widest (down_proj).
@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 32, quant.GEMM_ROWS + 1])
@pytest.mark.parametrize("shape", [(97, 160), (1, 32), (5, 1536)])
def test_the_exact_product_equals_the_dequantized_matmul(
    rows: int, kind: str, shape: tuple[int, int]
) -> None:
    assert quant.kernel() is not None, quant.kernel_failure()
    weights = random_blocks(kind, *shape, seed=rows)
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
    w = weights.dequantize().double()
    # Against the float64 product of the dequantized weights, to within float32 summation
    # error (a millionth of sum |x w|; the kernel's is ~1e-8, torch's float32 GEMM's ~5e-8,
    # one wrong weight's ~1e-3).
    error = (block_linear(x, weights).double() - x.double() @ w.T).abs()
    assert (error <= 1e-6 * (x.double().abs() @ w.abs().T)).all(), error.max()


@pytest.mark.parametrize("kind", list(FORMATS))
def test_a_rows_exact_product_does_not_depend_on_the_rows_beside_it(kind: str) -> None:
    # Every exact kernel (one row, panel tiles of 1-3 rows) sums in one order, so a request
    # gets the same logits bit for bit alone or in any decode batch up to GEMM_ROWS.
    weights = random_blocks(kind, 97, 1536, seed=3)
    x = torch.randn(quant.GEMM_ROWS, 1536, generator=torch.Generator().manual_seed(3))
    alone = torch.cat([block_linear(x[i : i + 1], weights) for i in range(len(x))])
    for rows in (2, 3, 4, 5, 8, quant.GEMM_ROWS):
        assert torch.equal(block_linear(x[:rows], weights), alone[:rows]), f"{rows} rows"


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("rows", [1, 3, 5, 32, quant.GEMM_ROWS + 1])
@pytest.mark.parametrize("shape", [(97, 160), (1, 32)])
def test_the_int8_dot_product_follows_llamacpps_arithmetic(
    rows: int, kind: str, shape: tuple[int, int]
) -> None:
    weights = random_blocks(kind, *shape, seed=rows)
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
    x[0, :32] = 0.0  # an all-zero block quantizes with scale 0
    expected = llamacpp_product(x.numpy(), weights.data.numpy(), kind)
    got = block_linear(x, weights, int8_dot=True)
    torch.testing.assert_close(got, torch.from_numpy(expected), rtol=1e-5, atol=1e-4)
    # ... and it is an approximation of the exact product, not something else.
    exact = x @ weights.dequantize().T
    assert (got - exact).abs().max() <= 0.02 * exact.abs().max()


def test_block_linear_keeps_leading_dims_and_refuses_a_wrong_width() -> None:
    weights = random_blocks("Q4_1", 8, 64)
    layer = BlockLinear(weights)
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(layer(x), x @ weights.dequantize().T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="32 columns"):
        block_linear(torch.randn(1, 32), weights)


def test_block_weights_refuse_a_row_of_the_wrong_size() -> None:
    with pytest.raises(ValueError, match="Q4_0 rows of 64 weights take 36 bytes"):
        BlockWeights(torch.zeros(2, 40, dtype=torch.uint8), FORMATS["Q4_0"], 64)


def test_cat_stacks_rows_of_one_format_only() -> None:
    a, b = random_blocks("Q4_1", 4, 64, 1), random_blocks("Q4_1", 3, 64, 2)
    both = BlockWeights.cat([a, b])
    assert both is not None
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    assert BlockWeights.cat([a, random_blocks("Q8_0", 3, 64)]) is None


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
    # The file's bytes, not a widened copy: 20 bytes per 32 Q4_1 weights, 34 per 32 Q8_0.
    assert blocks.nbytes == blocks.shape[0] * blocks.shape[1] // 32 * blocks.format.block_bytes


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
    assert (weight_path(packed.runner.model), weight_path(floats.runner.model)) == (
        "packed",
        "float",
    )
    # A decode step reads the file's bytes: well under a third of the float32 weights.
    packed_bytes = decode_weight_bytes(packed.runner.model)
    assert packed_bytes * 3 < decode_weight_bytes(floats.runner.model)


def test_without_the_kernel_the_weights_stay_float(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_blocks, "kernel", lambda: None)
    runner = ModelRunner(ServerArgs(model=MODEL, device="cpu", num_kv_pages=8))
    assert not any(isinstance(m, BlockLinear) for m in runner.model.modules())
    assert runner.weight_path == "float"


def test_a_non_gguf_model_is_left_alone() -> None:
    runner = ModelRunner(ServerArgs(model="tiny-llama", device="cpu", num_kv_pages=8))
    assert pack_gguf(runner.model, object(), tied=False) == 0


def test_a_bad_gguf_weights_value_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"gguf.weights"):
        ServerArgs(gguf_weights="int3")


def test_without_a_compiler_the_kernel_is_refused_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(quant, "_module", None)
    monkeypatch.setattr(quant, "_failure", None)
    monkeypatch.setenv("ROUNDGATE_CACHE", str(tmp_path))  # nothing cached: it must compile
    monkeypatch.setenv("CXX", "false")
    with caplog.at_level("WARNING", logger="roundgate.kernels"):
        assert quant.kernel() is None
    assert "false failed" in quant.kernel_failure()
    assert "block-quantized kernel unavailable" in caplog.text
