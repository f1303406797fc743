"""Block-FP8 checkpoints kept FP8 (``--fp8-weights``): a tiny DeepSeek-V3 made FP8 in the test
loads as ``Fp8Linear`` layers and FP8 expert rows, holds fewer bytes, and generates the same
greedy tokens as the dequantized load. The keep path runs here as it would on CUDA but for the
products, which ``Fp8Linear`` and the FP8 experts compute off CUDA by dequantizing per call:
the CUDA path in everything the loader decides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from family_models import deepseek_v3
from safetensors.torch import load_file, save_file

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.model import decoder
from roundgate.actors.model.decoder import build_model, open_source
from roundgate.actors.model.fp8 import keeps_fp8
from roundgate.actors.model.moe import SparseMoE
from roundgate.actors.server_args import ServerArgs
from roundgate.kernels.quant.fp8_blocks import quantize_weight_blocks
from roundgate.kernels.quant.fp8_expert_rows import Fp8ExpertRows
from roundgate.kernels.quant.fp8_linear import Fp8Linear

PROMPTS = [[5, 7, 9], list(range(20, 37)), [250, 11, 42, 42, 7, 8]]
GREEDY = SamplingParams(max_tokens=8)


def write_fp8_deepseek(path: Path, intermediate: int, moe_intermediate: int) -> Path:
    """A random tiny DeepSeek-V3 with every projection stored e4m3 in 128x128 blocks, as
    DeepSeek-V3's checkpoint stores them (norms, embeddings, routers left high)."""
    torch.manual_seed(0)
    model = deepseek_v3(
        intermediate_size=intermediate, moe_intermediate_size=moe_intermediate
    ).eval()
    model.save_pretrained(path / "bf16")
    state = {}
    for name, tensor in load_file(str(path / "bf16" / "model.safetensors")).items():
        if name.endswith(("proj.weight", "mqa.weight")):
            state[name], state[name + "_scale_inv"] = quantize_weight_blocks(tensor)
        else:
            state[name] = tensor
    out = path / "fp8"
    out.mkdir()
    save_file(state, str(out / "model.safetensors"))
    hf = json.loads((path / "bf16" / "config.json").read_text())
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (out / "config.json").write_text(json.dumps({**hf, "quantization_config": quant}))
    return out


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Widths that are whole 128-row blocks (DeepSeek-V3's all are): every projection stacks."""
    return write_fp8_deepseek(tmp_path_factory.mktemp("fp8"), 128, 128)


def engine(model: Path, fp8_weights: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """An engine on CPU whose runner opens the checkpoint with ``--fp8-weights``."""
    args = ServerArgs(
        model=str(model), device="cpu", num_kv_pages=64, max_num_seqs=4, fp8_weights=fp8_weights
    )
    return Engine(args)


def held_bytes(model: torch.nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def test_kept_fp8_holds_fp8_and_generates_the_dequantized_tokens(
    fp8_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    kept = engine(fp8_dir, "keep", monkeypatch)
    dequantized = engine(fp8_dir, "dequantize", monkeypatch)
    model = kept.runner.model
    fp8 = {n for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    # q_a, q_b, kv_a, o of each of the 3 layers, the dense layer's and the 2 shared experts'
    # gate_up and down; kv_b_proj is dequantized (absorbed per head).
    assert len(fp8) == 3 * 4 + 3 * 2
    assert "layers.0.self_attn.q_b_proj" in fp8 and "layers.1.mlp.shared.gate_up_proj" in fp8
    for layer in model.layers:
        assert layer.self_attn.kv_b_proj.dtype == torch.float32
    for m in fp8:
        linear = model.get_submodule(m)
        assert (linear.weight.dtype, linear.weight_scale_inv.dtype) == (
            torch.float8_e4m3fn,
            torch.float32,
        )
    moes = model.layers[1:]
    assert all(isinstance(layer.mlp, SparseMoE) for layer in moes)
    for layer in moes:
        assert layer.mlp.fp8_rows is not None and layer.mlp.w13.dtype == torch.uint8
    assert not any(isinstance(m, Fp8Linear) for m in dequantized.runner.model.modules())
    assert held_bytes(model) * 2 < held_bytes(dequantized.runner.model)
    assert kept.generate(PROMPTS, GREEDY) == dequantized.generate(PROMPTS, GREEDY)


def test_an_intermediate_off_the_blocks_dequantizes_that_mlp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """96 gate rows end mid-block: gate and up cannot share one scale grid, so the dense MLP
    and the shared expert (32 rows) are dequantized; the experts' stacked scales need no such
    rule and stay FP8."""
    torch.set_num_threads(1)
    path = write_fp8_deepseek(tmp_path, 96, 32)
    kept = engine(path, "keep", monkeypatch)
    model = kept.runner.model
    assert not isinstance(model.layers[0].mlp.gate_up_proj, Fp8Linear)
    assert isinstance(model.layers[0].mlp.down_proj, Fp8Linear)  # [64, 96]: one part
    assert model.layers[1].mlp.fp8_rows is not None
    dequantized = engine(path, "dequantize", monkeypatch)
    assert kept.generate(PROMPTS, GREEDY) == dequantized.generate(PROMPTS, GREEDY)


def test_auto_keeps_fp8_on_cuda_only(fp8_dir: Path) -> None:
    """``build_model`` decides ``auto`` for its device: the CUDA decision taken on a CPU
    model (loaded, then left where it is) holds FP8; the CPU one dequantizes."""
    config = ServerArgs(model=str(fp8_dir), device="cpu").model_config
    source = open_source(str(fp8_dir), config, 0)  # auto
    assert source.fp8_weights == "auto" and not source.keep_fp8
    assert source.for_device("cuda:3").keep_fp8
    assert not source.for_device("cpu").keep_fp8
    cpu = build_model(config, source, device="cpu")
    assert not any(isinstance(m, Fp8Linear) for m in cpu.modules())


@pytest.mark.parametrize(
    ("mode", "device", "block", "expected"),
    [
        ("auto", "cuda", (128, 128), True),
        ("auto", "cuda:1", (128, 128), True),
        ("auto", "cpu", (128, 128), False),
        ("auto", "cuda", (16, 16), False),
        ("keep", "cpu", (128, 128), True),
        ("dequantize", "cuda", (128, 128), False),
    ],
)
def test_keeps_fp8(mode: str, device: str, block: tuple[int, int], expected: bool) -> None:
    assert keeps_fp8(mode, device, block) is expected


@pytest.mark.parametrize(
    ("mode", "block", "message"),
    [("keep", (16, 16), "--fp8-weights keep: the checkpoint's blocks are 16x16"),
     ("fp4", (128, 128), "--fp8-weights must be one of auto, keep, dequantize")],
)  # fmt: skip
def test_keeps_fp8_refuses_naming_the_flag(mode: str, block: tuple[int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        keeps_fp8(mode, "cuda", block)


@pytest.mark.parametrize(
    ("model", "message"),
    [("tiny-moe", "--fp8-weights keep: tiny-moe is not a block-scaled FP8 checkpoint")],
)
def test_server_args_refuse_keep_without_fp8_weights(model: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerArgs(model=model, fp8_weights="keep")
    with pytest.raises(ValueError, match="--fp8-weights must be one of"):
        ServerArgs(model=model, fp8_weights="yes")


def test_server_args_take_keep_for_fp8_blocks(fp8_dir: Path) -> None:
    assert ServerArgs(model=str(fp8_dir), device="cpu", fp8_weights="keep").fp8_weights == "keep"


def test_moving_an_fp8_linear_keeps_its_dtypes() -> None:
    codes, scales = quantize_weight_blocks(torch.randn(200, 130))
    layer = Fp8Linear(codes, scales)
    layer.to(torch.bfloat16)
    assert (layer.weight.dtype, layer.weight_scale_inv.dtype) == (
        torch.float8_e4m3fn,
        torch.float32,
    )
    assert torch.equal(layer.weight.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(layer.weight_scale_inv, scales)


def test_expert_rows_hold_codes_and_scales_per_slot() -> None:
    """A slot's codes and scales live in its own byte row: moving rows moves both."""
    rows = Fp8ExpertRows.gate_up(hidden=130, inter=96)
    packed = rows.allocate(3)
    experts = [quantize_weight_blocks(torch.randn(96, 130)) for _ in range(6)]
    for slot in range(3):
        gate, up = experts[2 * slot], experts[2 * slot + 1]
        codes = torch.cat([gate[0].view(torch.uint8), up[0].view(torch.uint8)])
        rows.write(packed[slot], codes.view(torch.float8_e4m3fn), torch.cat([gate[1], up[1]]))
    swapped = packed[[2, 0, 1]].clone()  # what EPLB's moves do to the rows
    codes, scales = rows.views(swapped)
    assert codes.shape == (3, 192, 130) and scales.shape == (3, 2, 2)
    assert torch.equal(codes[1, :96].view(torch.uint8), experts[0][0].view(torch.uint8))
    assert torch.equal(scales[0, 1:], experts[5][1])
    assert rows.scale_offset % 16 == 0 and codes.stride(-1) == 1


def test_the_default_model_path_ignores_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-FP8 checkpoint opens as before whatever ``--fp8-weights`` says."""
    config = ServerArgs(model="tiny-llama").model_config
    assert type(decoder.open_source("tiny-llama", config, 0, "keep")).__name__ == "DictSource"


def test_moves_and_rereads_carry_an_fp8_experts_scales(
    fp8_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EPLB's moves (``apply_moves`` on ``w13``/``w2``) swap whole rows, scales included; an
    elastic re-home reads a slot back from the files through a dequantizing source and still
    writes the stored codes and scales."""
    from roundgate.actors.model.expert_moves import apply_moves
    from roundgate.kernels.moe.eplb import Move

    moe = engine(fp8_dir, "keep", monkeypatch).runner.model.layers[1].mlp
    rows13, rows2 = moe.fp8_rows
    before = [rows.views(w)[i][:2].clone() for rows, w in ((rows13, moe.w13), (rows2, moe.w2))
              for i in (0, 1)]  # fmt: skip
    swap = [Move(1, 0, 1, 0, 0), Move(0, 0, 0, 0, 1)]
    apply_moves([moe.w13, moe.w2], swap, rank=0, world_size=1)
    after = [rows.views(w)[i][:2] for rows, w in ((rows13, moe.w13), (rows2, moe.w2))
             for i in (0, 1)]  # fmt: skip
    for moved, kept in zip(after, before, strict=True):
        assert torch.equal(moved.flip(0).view(torch.uint8), kept.view(torch.uint8))
    apply_moves([moe.w13, moe.w2], swap, rank=0, world_size=1)  # back
    original = moe.w13[0].clone()
    moe.w13[0].zero_()
    config = ServerArgs(model=str(fp8_dir), device="cpu").model_config
    moe.load_experts(open_source(str(fp8_dir), config, 0, "dequantize"), "model.layers.1.", [0])
    assert torch.equal(moe.w13[0], original)


@pytest.mark.parametrize(
    ("mode", "device", "keeps"),
    [("auto", "cuda", True), ("auto", "cpu", False), ("keep", "cpu", True), ("auto", None, False)],
)
def test_open_source_resolves_auto_for_a_given_device(
    fp8_dir: Path, mode: str, device: str | None, keeps: bool
) -> None:
    """What the runner's hook passes (``--fp8-weights`` and its device): the source it hands
    to the model, the draft layer and re-homing all keep or all dequantize."""
    config = ServerArgs(model=str(fp8_dir), device="cpu").model_config
    source = open_source(str(fp8_dir), config, 0, mode, device)
    assert source.keep_fp8 is keeps
    assert source.fp8_weights == (mode if device is None else ("keep" if keeps else "dequantize"))


@pytest.mark.triton
def test_masked_experts_over_fp8_rows_equal_the_grouped_ones(
    fp8_dir: Path, kernel_device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer holding FP8 experts takes DeepEP's masked layout (``run_masked_experts``, the
    counts a device tensor) and gives each valid row what the grouped rows give it."""
    from roundgate.kernels.moe.base import run_experts

    if kernel_device != "cpu":
        pytest.skip("a CPU engine's layer: the masked experts run under Triton's interpreter")
    moe = engine(fp8_dir, "keep", monkeypatch).runner.model.layers[1].mlp
    num_experts, hidden = moe.w13.shape[0], moe.fp8_rows[1].rows
    counts = [(e * 3) % 4 for e in range(num_experts)]
    x = torch.randn(sum(counts), hidden, generator=torch.Generator().manual_seed(0))
    grouped = moe.run_fp8_experts(x, counts, run_experts)
    packed = torch.zeros(num_experts, max(counts), hidden)
    start = 0
    for expert, count in enumerate(counts):
        packed[expert, :count] = x[start : start + count]
        start += count
    masked = moe.run_masked_experts(packed, torch.tensor(counts, dtype=torch.int32))
    start = 0
    for expert, count in enumerate(counts):
        got, want = masked[expert, :count], grouped[start : start + count]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        start += count
