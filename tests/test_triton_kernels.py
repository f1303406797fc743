"""Every Triton kernel against the torch reference, on random data and ragged shapes.

Without a GPU the kernels run under Triton's interpreter (the ``kernel_device`` fixture),
so CI checks their indexing, masking and online softmax on every run; on a GPU the same
tests run them compiled. Shapes are small (the interpreter runs each program in Python) but
cover odd head dims, GQA groups 1/4/8, page sizes 1/16/64, ragged lengths, empty and
one-token sequences, plus a few seeded random draws of all of these.
"""

from __future__ import annotations

import random

import pytest
import torch

from roundgate.kernels.attention.batch import PagedKVCache, build_attention_batch
from roundgate.kernels.attention.mla_torch import TorchMLAAttention
from roundgate.kernels.attention.torch_ref import TorchAttention
from roundgate.kernels.attention.triton_backend import TritonAttention, TritonMLAAttention
from roundgate.kernels.attention.triton_decode import paged_decode
from roundgate.kernels.moe.base import run_experts
from roundgate.kernels.moe.triton_experts import tile_table, triton_run_experts

pytestmark = pytest.mark.triton

ATOL = RTOL = 1e-5  # float32 on both sides; only the summation order differs
NUM_PAGES = 64

# (heads, kv_heads, head_dim, page_size, cached tokens, new tokens) per batch.
GQA_CASES = [
    (2, 2, 8, 1, [0, 3], [5, 1]),  # group 1, one token a page
    (8, 2, 20, 16, [5, 0, 37], [3, 17, 1]),  # group 4, chunk over a prefix, fresh prompt
    (8, 1, 13, 64, [70, 0, 2], [9, 1, 0]),  # group 8, odd dim; one-token and empty sequences
    (4, 4, 33, 16, [0], [40]),  # one fresh prompt, odd dim past one 32-lane tile
]
# (heads, kv_heads, head_dim, page_size, kv lengths): one new token per sequence.
DECODE_CASES = [
    (2, 2, 8, 1, [1, 7, 3]),  # group 1; a one-token sequence
    (8, 2, 20, 16, [5, 37, 100]),  # group 4
    (8, 1, 13, 64, [1, 70, 129]),  # group 8, odd dim, several 64-token pages
    (4, 1, 5, 16, []),  # an empty batch
]
# (heads, kv_lora_rank, rope dim, page_size, cached, new); nope dim 12, v dim 10.
MLA_CASES = [
    (4, 16, 8, 16, [0, 6, 20], [1, 1, 1]),  # decodes (the family tests' latent shape)
    (1, 12, 6, 1, [3, 0], [1, 1]),  # one head, odd widths, one token a page
    (8, 32, 16, 64, [70], [1]),  # eight heads past one 64-token page
    (4, 16, 8, 16, [5, 0, 37], [3, 17, 1]),  # extend: chunk over a prefix, fresh prompt
    (8, 12, 6, 64, [70, 0, 2], [9, 1, 0]),  # extend with one-token and empty sequences
    (2, 16, 8, 1, [0], [11]),  # one fresh prompt, one token a page
]
# (hidden, intermediate, rows per local expert).
MOE_CASES = [
    (64, 32, [3, 0, 18, 1]),  # an expert without rows, one past a 16-row tile
    (40, 20, [0, 0, 5]),  # odd sizes, rows only for the last expert
    (24, 48, [1] * 8),  # eight experts, one row each (a decode)
    (16, 16, [0, 0]),  # no rows at all (an idle rank)
    (33, 17, [40]),  # one expert, odd sizes, three tiles
]


def random_gqa_cases(count: int, seed: int) -> list[tuple]:
    """Seeded draws: group 1/4/8, odd or even head dim, page 1/16/64, 1-4 ragged sequences."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        kv_heads, group = rng.choice([1, 2]), rng.choice([1, 4, 8])
        size = rng.randint(1, 4)
        cached = [rng.choice([0, rng.randint(1, 80)]) for _ in range(size)]
        new = [rng.choice([0, 1, rng.randint(2, 24)]) for _ in range(size)]
        new[0] = max(new[0], 1)
        cases.append(
            (
                kv_heads * group,
                kv_heads,
                rng.randint(3, 40),
                rng.choice([1, 16, 64]),
                cached,
                new,
            )
        )
    return cases


def scattered_tables(lengths: list[int], page_size: int, seed: int = 1) -> list[list[int]]:
    """Disjoint shuffled page tables (page order != token order); a sequence needs >= 1 page."""
    perm = torch.randperm(NUM_PAGES, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, used = [], 0
    for length in lengths:
        n = max(1, -(-length // page_size))
        tables.append(perm[used : used + n])
        used += n
    return tables


def _random_cache(cache: PagedKVCache, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in [*cache.k, *cache.v]:
        t.copy_(torch.randn(t.shape, generator=gen))


def gqa_error(case: tuple, device: str) -> float:
    """Max |triton - torch reference| over one GQA batch (extend or decode kernel)."""
    heads, kv_heads, dim, page_size, cached, new = case
    totals = [c + n for c, n in zip(cached, new, strict=True)]
    tables = scattered_tables(totals, page_size)
    cache = PagedKVCache.allocate(1, NUM_PAGES, page_size, kv_heads, dim, torch.float32, "cpu")
    _random_cache(cache, seed=2)
    cache.k[0], cache.v[0] = cache.k[0].to(device), cache.v[0].to(device)
    batch = build_attention_batch(new, cached, tables, page_size, device)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(batch.num_tokens, heads, dim, generator=gen).to(device)
    k = torch.randn(batch.num_tokens, kv_heads, dim, generator=gen).to(device)
    v = torch.randn(batch.num_tokens, kv_heads, dim, generator=gen).to(device)
    outs = []
    for backend in (TorchAttention(), TritonAttention()):
        outs.append(backend.forward(0, q, k, v, cache, batch, backend.prepare(batch), dim**-0.5))
    torch.testing.assert_close(outs[1], outs[0], atol=ATOL, rtol=RTOL)
    return float((outs[1] - outs[0]).abs().max()) if outs[0].numel() else 0.0


def decode_error(case: tuple, device: str) -> float:
    """Max error of the decode kernel itself on a decode-only batch."""
    heads, kv_heads, dim, page_size, kv_lens = case
    if not kv_lens:  # an empty batch: nothing to launch, an empty answer
        batch = build_attention_batch([], [], [], page_size, device)
        cache = PagedKVCache.allocate(1, 4, page_size, kv_heads, dim, torch.float32, device)
        out = paged_decode(
            torch.empty(0, heads, dim, device=device), cache.k[0], cache.v[0], batch, 1.0
        )
        assert out.shape == (0, heads, dim)
        return 0.0
    return gqa_error(
        (heads, kv_heads, dim, page_size, [n - 1 for n in kv_lens], [1] * len(kv_lens)), device
    )


def mla_error(case: tuple, device: str) -> float:
    """Max |triton - torch reference| over one latent-attention batch."""
    heads, rank, rope, page_size, cached, new = case
    nope, v_dim = 12, 10
    totals = [c + n for c, n in zip(cached, new, strict=True)]
    tables = scattered_tables(totals, page_size)
    cache = PagedKVCache.allocate_latent(1, NUM_PAGES, page_size, rank + rope, torch.float32, "cpu")
    _random_cache(cache, seed=4)
    cache.k[0] = cache.k[0].to(device)
    batch = build_attention_batch(new, cached, tables, page_size, device)
    gen = torch.Generator().manual_seed(5)
    tokens = batch.num_tokens

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device)

    args = (
        rand(tokens, heads, nope),
        rand(tokens, heads, rope),
        rand(tokens, rank),
        rand(tokens, rope),
        rand(heads, nope, rank) * rank**-0.5,
        rand(heads, v_dim, rank) * rank**-0.5,
    )
    scale = (nope + rope) ** -0.5
    outs = []
    for backend in (TorchMLAAttention(), TritonMLAAttention()):
        state = backend.prepare(batch)
        outs.append(backend.forward_latent(0, *args, cache, batch, state, scale))
    torch.testing.assert_close(outs[1], outs[0], atol=ATOL, rtol=RTOL)
    return float((outs[1] - outs[0]).abs().max()) if outs[0].numel() else 0.0


def moe_error(case: tuple, device: str) -> float:
    """Max |triton - run_experts| over one grouped batch of expert rows."""
    hidden, inter, counts = case
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(sum(counts), hidden, generator=gen).to(device)
    w13 = (torch.randn(len(counts), 2 * inter, hidden, generator=gen) * hidden**-0.5).to(device)
    w2 = (torch.randn(len(counts), hidden, inter, generator=gen) * inter**-0.5).to(device)
    expected = run_experts(x, counts, w13, w2)
    out = triton_run_experts(x, counts, w13, w2)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)
    return float((out - expected).abs().max()) if out.numel() else 0.0


@pytest.mark.parametrize("case", GQA_CASES + random_gqa_cases(4, seed=0), ids=str)
def test_gqa_paged_attention_matches_the_reference(case: tuple, kernel_device: str) -> None:
    gqa_error(case, kernel_device)


@pytest.mark.parametrize("case", DECODE_CASES, ids=str)
def test_gqa_decode_kernel_matches_the_reference(case: tuple, kernel_device: str) -> None:
    decode_error(case, kernel_device)


@pytest.mark.parametrize("case", MLA_CASES, ids=str)
def test_mla_absorbed_kernel_matches_the_reference(case: tuple, kernel_device: str) -> None:
    mla_error(case, kernel_device)


@pytest.mark.parametrize("case", MOE_CASES, ids=str)
def test_fused_experts_match_run_experts(case: tuple, kernel_device: str) -> None:
    moe_error(case, kernel_device)


def test_expert_tiles_never_straddle_experts() -> None:
    expert, start, end = tile_table([3, 0, 18], 16, "cpu")
    assert (expert.tolist(), start.tolist(), end.tolist()) == ([0, 2, 2], [0, 3, 19], [3, 21, 21])


def test_fused_experts_refuse_mismatched_counts(kernel_device: str) -> None:
    x = torch.zeros(3, 8, device=kernel_device)
    w13, w2 = torch.zeros(2, 8, 8, device=kernel_device), torch.zeros(2, 8, 4, device=kernel_device)
    with pytest.raises(ValueError, match="expert counts"):
        triton_run_experts(x, [1, 1], w13, w2)
