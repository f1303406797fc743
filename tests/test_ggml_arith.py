"""llama.cpp's float arithmetic (``roundgate.kernels.quant.ggml_arith``) against torch's: the same
operations up to float rounding. Bit-equality with llama.cpp itself is checked against its
library in tests/integration/test_int8_dot_vs_llamacpp.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_attention import dense_attention, scattered_pages

from roundgate.actors.model.config import PRESETS, with_overrides
from roundgate.actors.model.llamacpp_arith import use_llamacpp_arithmetic, why_not
from roundgate.actors.model.rope import RotaryTable, apply_rope
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.server_args import ServerArgs
from roundgate.kernels.attention.batch import PagedKVCache, build_attention_batch
from roundgate.kernels.quant import cpu_supports_kernel, ggml_arith

pytestmark = pytest.mark.skipif(not cpu_supports_kernel(), reason="needs AVX2/FMA/F16C")

HEADS, KV_HEADS, DIM = 6, 2, 64


def test_rms_norm_swiglu_and_rope_follow_torchs() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 576, generator=gen) * 3
    w = torch.randn(576, generator=gen)
    torch.testing.assert_close(ggml_arith.rms_norm(x, w, 1e-5), F.rms_norm(x, (576,), eps=1e-5) * w)
    gate_up = torch.randn(3, 2 * 100, generator=gen) * 4  # 100: a tail past the 8-wide loop
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(ggml_arith.swiglu(gate_up), F.silu(gate) * up)
    cos, sin = ggml_arith.rope_table(4096, DIM, 10000.0)
    table = RotaryTable(DIM, 4096, 10000.0)
    torch.testing.assert_close(cos, table.cos, atol=5e-4, rtol=0)  # angles to ~4000 rad
    positions = torch.tensor([0, 3, 1000, 4095])
    qk = torch.randn(4, HEADS + KV_HEADS, DIM, generator=gen)
    expected = apply_rope(qk, *table.lookup(positions, torch.float32))
    rotated = ggml_arith.rope_(qk.clone(), cos[positions], sin[positions])
    torch.testing.assert_close(rotated, expected, atol=1e-3, rtol=1e-4)


def test_rope_refuses_rows_without_contiguous_heads() -> None:
    x = torch.randn(2, 8, 3)  # transposed: heads not contiguous
    cos, sin = ggml_arith.rope_table(4, 8, 10000.0)
    with pytest.raises(ValueError, match="contiguous heads"):
        ggml_arith.rope_(x.transpose(1, 2), cos[:2], sin[:2])


@pytest.mark.parametrize(
    ("cached", "new", "page_size"),
    [
        ([0, 0, 0], [5, 1, 40], 4),  # prefill only, ragged (40: past one 32-wide block)
        ([7, 33, 12], [1, 1, 1], 4),  # decode only, several sequences
        ([70], [1], 16),  # one sequence decoding: ggml's four-accumulator order
        ([6, 0, 9], [1, 5, 3], 4),  # mixed: decode, prefill, extend of a cached prefix
    ],
)
def test_attention_follows_dense_attention(cached: list[int], new: list[int], page_size: int):
    gen = torch.Generator().manual_seed(0)
    totals = [c + n for c, n in zip(cached, new, strict=True)]
    tables = scattered_pages(totals, page_size, num_pages=64)
    cache = PagedKVCache.allocate(1, 64, page_size, KV_HEADS, DIM, torch.float32, "cpu")
    full_k = [torch.randn(t, KV_HEADS, DIM, generator=gen) for t in totals]
    full_v = [torch.randn(t, KV_HEADS, DIM, generator=gen) for t in totals]
    backend = ggml_arith.GgmlAttention()
    scale = DIM**-0.5
    # The cached prefixes, written by an earlier round of the same backend (K in file order).
    prefix = build_attention_batch(cached, [0] * len(cached), tables, page_size)
    if prefix.num_tokens:
        k_old = torch.cat([k[:c] for k, c in zip(full_k, cached, strict=True)])
        v_old = torch.cat([v[:c] for v, c in zip(full_v, cached, strict=True)])
        q_old = torch.randn(prefix.num_tokens, HEADS, DIM, generator=gen)
        backend.forward(0, q_old, k_old, v_old, cache, prefix, None, scale)
    batch = build_attention_batch(new, cached, tables, page_size)
    q = torch.randn(batch.num_tokens, HEADS, DIM, generator=gen)
    k_new = torch.cat([k[c:] for k, c in zip(full_k, cached, strict=True)])
    v_new = torch.cat([v[c:] for v, c in zip(full_v, cached, strict=True)])
    out = backend.forward(0, q, k_new, v_new, cache, batch, backend.prepare(batch), scale)
    expected = torch.cat(
        [
            dense_attention(q_b, full_k[b], full_v[b], cached[b])
            for b, q_b in enumerate(q.split(new))
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_attention_refuses_a_head_size_it_cannot_sum_like_ggml() -> None:
    batch = build_attention_batch([1], [0], [[0]], 4)
    cache = PagedKVCache.allocate(1, 2, 4, 1, 16, torch.float32, "cpu")
    q, kv = torch.randn(1, 1, 16), torch.randn(1, 1, 16)
    with pytest.raises(ValueError, match="head size 16"):
        ggml_arith.GgmlAttention().forward(0, q, kv, kv, cache, batch, None, 0.25)


def test_a_model_in_llamacpps_arithmetic_scores_as_in_torchs() -> None:
    """tiny-llama (float weights) with every covered operation switched: prefill of a ragged
    batch, then decode, logits equal torch's up to float rounding."""
    torch.set_num_threads(1)
    args = ServerArgs(model="tiny-llama", device="cpu", num_kv_pages=32)
    torch_runner, ggml_runner = ModelRunner(args), ModelRunner(args)
    assert use_llamacpp_arithmetic(ggml_runner.model, args.model_config)
    ggml_runner.attention = ggml_arith.GgmlAttention()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (9, 34)]
    tables = [[0, 1, 2], [3, 4, 5, 6, 7]]
    for runner_round in (
        (prompts, [0, 0]),
        ([[5], [7]], [9, 34]),
        ([[11], [13]], [10, 35]),
    ):
        chunks, cached = runner_round
        batch = build_attention_batch([len(c) for c in chunks], cached, tables, args.page_size)
        ids = torch.tensor([t for c in chunks for t in c])
        with torch.inference_mode():
            want = torch_runner.forward_batch(ids, batch)
            got = ggml_runner.forward_batch(ids, batch)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_only_the_llama_style_decoder_is_covered() -> None:
    assert why_not(PRESETS["tiny-llama"]) is None
    assert "MoE" in why_not(PRESETS["tiny-moe"])
    assert "biases" in why_not(with_overrides(PRESETS["tiny-llama"], qkv_bias=True))
    assert "head" in why_not(with_overrides(PRESETS["tiny-llama"], head_dim=16))


def test_the_fused_decoder_equals_the_layer_by_layer_path() -> None:
    """The default model, int8-dot: all layers in one call give the same logits, to the bit,
    as the flagged modules one operation at a time (a ragged prefill, then decode rounds)."""
    torch.set_num_threads(1)
    args = ServerArgs(
        model="smollm2-135m-instruct", device="cpu", num_kv_pages=16, gguf_weights="int8-dot"
    )
    fused, stepwise = ModelRunner(args), ModelRunner(args)
    assert fused.model.fused is not None and fused.attention.name == "ggml"
    stepwise.model.fused = None
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (7, 20)]
    tables = [[0, 1], [2, 3]]
    rounds = [(prompts, [0, 0]), ([[42], [43]], [7, 20]), ([[44]], [8])]
    for chunks, cached in rounds:
        lens = [len(c) for c in chunks]
        batch = build_attention_batch(lens, cached, tables[: len(chunks)], args.page_size)
        ids = torch.tensor([t for c in chunks for t in c])
        with torch.inference_mode():
            assert torch.equal(fused.forward_batch(ids, batch), stepwise.forward_batch(ids, batch))


def test_the_exact_path_fuses_decode_rounds_only() -> None:
    """Packed exact weights: decode-sized batches run fused (float32 throughout, torch's cache
    layout) and score as the layer-by-layer path does, up to float rounding; a long prefill
    runs the layers (where the dequantized GEMM is faster)."""
    torch.set_num_threads(1)
    args = ServerArgs(model="smollm2-135m-instruct", device="cpu", num_kv_pages=16)
    fused, stepwise = ModelRunner(args), ModelRunner(args)
    assert fused.model.fused is not None and fused.attention.name == "torch"
    assert not fused.model.fused.takes(49) and fused.model.fused.takes(48)
    stepwise.model.fused = None
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (60, 9)]
    tables = [[0, 1, 2, 3, 4], [5, 6]]
    rounds = [(prompts, [0, 0]), ([[42], [43]], [60, 9]), ([[44]], [61])]
    for chunks, cached in rounds:
        lens = [len(c) for c in chunks]
        batch = build_attention_batch(lens, cached, tables[: len(chunks)], args.page_size)
        ids = torch.tensor([t for c in chunks for t in c])
        with torch.inference_mode():
            got, want = fused.forward_batch(ids, batch), stepwise.forward_batch(ids, batch)
        torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-4)
    args = ServerArgs(model="smollm2-135m-instruct", device="cpu", gguf_weights="float")
    assert ModelRunner(args).model.fused is None  # no blocks: nothing to fuse


def test_without_a_compiler_int8_dot_keeps_torchs_operations_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ggml_arith, "_lib", None)
    monkeypatch.setattr(ggml_arith, "_failure", None)
    monkeypatch.setenv("ROUNDGATE_CACHE", str(tmp_path))  # nothing cached: it must compile
    monkeypatch.setenv("CXX", "false")
    args = ServerArgs(
        model="smollm2-135m-instruct", device="cpu", num_kv_pages=16, gguf_weights="int8-dot"
    )
    with caplog.at_level("WARNING", logger="roundgate.model"):
        runner = ModelRunner(args)  # the block kernel was built before: its products still run
    assert runner.weight_path == "int8-dot"
    assert runner.attention.name == "torch" and runner.model.fused is None
    assert "torch's float operations kept" in caplog.text and "false failed" in caplog.text
    batch = build_attention_batch([3], [0], [[0]], args.page_size)
    with torch.inference_mode():
        assert runner.forward_batch(torch.tensor([1, 2, 3]), batch).isfinite().all()
