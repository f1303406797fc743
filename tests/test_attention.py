"""Paged attention: the torch reference against naive dense attention, and backend choice."""

from __future__ import annotations

import math

import pytest
import torch

from roundgate.kernels.attention import registry
from roundgate.kernels.attention.batch import PagedKVCache, build_attention_batch
from roundgate.kernels.attention.torch_ref import TorchAttention

HEADS, KV_HEADS, DIM = 4, 2, 8


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """One sequence, no pages: query row i sits at position ``start + i``."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    q_pos = torch.arange(q.shape[0])[:, None] + start
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def scattered_pages(lengths: list[int], page_size: int, num_pages: int) -> list[list[int]]:
    """Disjoint, shuffled page tables, so page order != token order."""
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(1)).tolist()
    tables, used = [], 0
    for length in lengths:
        n = -(-length // page_size)
        tables.append(perm[used : used + n])
        used += n
    return tables


@pytest.mark.parametrize(
    ("cached", "new", "page_size"),
    [
        ([0, 0, 0], [5, 1, 9], 4),  # prefill only, ragged
        ([7, 3, 12], [1, 1, 1], 4),  # decode only
        ([6, 0, 9], [1, 5, 3], 4),  # mixed: decode, prefill, extend of a cached prefix
        ([5], [11], 1),  # one token a page
        ([2, 30], [3, 1], 16),  # several sequences inside single pages
        ([0], [0 + 40], 8),  # long-ish prefill
    ],
)
def test_reference_equals_dense_attention(cached: list[int], new: list[int], page_size: int):
    gen = torch.Generator().manual_seed(0)
    totals = [c + n for c, n in zip(cached, new, strict=True)]
    tables = scattered_pages(totals, page_size, num_pages=64)
    cache = PagedKVCache.allocate(1, 64, page_size, KV_HEADS, DIM, torch.float32, "cpu")
    full_k = [torch.randn(t, KV_HEADS, DIM, generator=gen) for t in totals]
    full_v = [torch.randn(t, KV_HEADS, DIM, generator=gen) for t in totals]
    # The cached prefixes are written by an earlier "round".
    prefix = build_attention_batch(cached, [0] * len(cached), tables, page_size)
    if prefix.num_tokens:
        cache.write(
            0,
            prefix.slot_mapping,
            torch.cat([k[:c] for k, c in zip(full_k, cached, strict=True)]),
            torch.cat([v[:c] for v, c in zip(full_v, cached, strict=True)]),
        )
    batch = build_attention_batch(new, cached, tables, page_size)
    q = torch.randn(batch.num_tokens, HEADS, DIM, generator=gen)
    k_new = torch.cat([k[c:] for k, c in zip(full_k, cached, strict=True)])
    v_new = torch.cat([v[c:] for v, c in zip(full_v, cached, strict=True)])
    backend = TorchAttention()
    out = backend.forward(0, q, k_new, v_new, cache, batch, backend.prepare(batch), scale=DIM**-0.5)
    expected = torch.cat(
        [
            dense_attention(q_b, full_k[b], full_v[b], cached[b])
            for b, q_b in enumerate(q.split(new))
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_batch_positions_and_slots() -> None:
    batch = build_attention_batch([2, 1], [3, 0], [[7, 2], [5]], page_size=4)
    assert batch.positions.tolist() == [3, 4, 0]
    assert batch.slot_mapping.tolist() == [7 * 4 + 3, 2 * 4 + 0, 5 * 4 + 0]
    assert batch.kv_lens.tolist() == [5, 1]
    assert not batch.is_decode_only


def test_short_page_table_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold 5 tokens"):
        build_attention_batch([5], [0], [[0]], page_size=4)


def test_parked_pages_round_trip() -> None:
    cache = PagedKVCache.allocate(2, 8, 4, KV_HEADS, DIM, torch.float32, "cpu")
    for t in cache.k + cache.v:
        t.normal_()
    saved = cache.read_pages([1, 3])
    cache.write_pages([6, 0], saved)
    for t in cache.k + cache.v:
        torch.testing.assert_close(t[[6, 0]], t[[1, 3]])


def _available(*names: str):
    return lambda module: module in names


@pytest.mark.parametrize(
    ("name", "device", "installed", "expected"),
    [
        ("auto", "cpu", ("flashinfer", "triton"), "torch"),
        ("auto", "cuda", ("flashinfer", "triton"), "flashinfer"),
        ("auto", "cuda", ("triton",), "triton"),
        ("auto", "cuda", (), "torch"),
        ("torch", "cuda", ("flashinfer",), "torch"),
        ("triton", "cuda", ("triton",), "triton"),
        ("flashinfer", "cuda", ("flashinfer",), "flashinfer"),
    ],
)
def test_backend_resolution(name: str, device: str, installed: tuple, expected: str) -> None:
    assert registry.resolve(name, device, _available(*installed)) == expected


@pytest.mark.parametrize(
    ("name", "device", "installed", "message"),
    [
        ("flashinfer", "cpu", ("flashinfer",), "needs a CUDA device"),
        ("triton", "cpu", ("triton",), "needs a CUDA device"),
        ("flashinfer", "cuda", (), "not installed"),
        ("magic", "cpu", (), "must be one of"),
    ],
)
def test_backend_refusals_name_the_flag(
    name: str, device: str, installed: tuple, message: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # no interpreter: triton needs CUDA
    with pytest.raises(ValueError, match=f"--attention-backend.*{message}"):
        registry.resolve(name, device, _available(*installed))


def test_cpu_auto_builds_the_reference() -> None:
    assert registry.build("auto", "cpu").name == "torch"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["triton", "flashinfer"])
@pytest.mark.parametrize("new", [[1, 1, 1], [4, 1, 9]])
def test_gpu_backends_match_the_reference(name: str, new: list[int]) -> None:
    pytest.importorskip(name)
    device, page_size = "cuda", 16
    cached = [20, 3, 40]
    tables = scattered_pages([c + n for c, n in zip(cached, new, strict=True)], page_size, 32)
    batch = build_attention_batch(new, cached, tables, page_size, device)
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch.num_tokens, HEADS, 64, generator=gen, device=device, dtype=torch.bfloat16)
    k = torch.randn(batch.num_tokens, KV_HEADS, 64, generator=gen, device=device).bfloat16()
    v = torch.randn_like(k)
    outs = []
    for backend in (
        TorchAttention(),
        registry.build(
            name, device, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=64, dtype=torch.bfloat16
        ),
    ):
        cache = PagedKVCache.allocate(1, 32, page_size, KV_HEADS, 64, torch.bfloat16, device)
        for t in cache.k + cache.v:
            t.copy_(
                torch.randn(
                    t.shape, generator=torch.Generator(device=device).manual_seed(2), device=device
                )
            )
        outs.append(backend.forward(0, q, k, v, cache, batch, backend.prepare(batch), 64**-0.5))
    torch.testing.assert_close(outs[1].float(), outs[0].float(), atol=2e-2, rtol=2e-2)
