"""The device-only MoE path: the one-launch router, the device-built expert layout and the
fused experts, against ``Router`` and torch references, within their op budgets and
without a host read.

Without a GPU the kernels run under Triton's interpreter (the ``kernel_device`` fixture);
shapes stay small. Op counts are aten calls seen by a ``TorchDispatchMode`` plus top-level
kernel launches; the torch calls the interpreter makes to run a launch are not counted.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from roundgate.actors.model.config import ModelConfig
from roundgate.actors.model.config_parts import RouterConfig
from roundgate.actors.model.moe import Router
from roundgate.kernels.moe.triton_fused_moe import (
    BLOCK_M,
    align_by_expert,
    fused_moe,
    masked_experts,
)
from roundgate.kernels.moe.triton_router import route, supports

pytestmark = pytest.mark.triton

HIDDEN = 24
# (name, router config, experts, top_k).
ROUTER_CASES = [
    ("deepseek-v3", RouterConfig("sigmoid", "noaux_tc", True, 4, 2, 2.5), 16, 4),
    ("deepseek-v3-full", RouterConfig("sigmoid", "noaux_tc", True, 8, 4, 2.5), 256, 8),
    ("deepseek-v2", RouterConfig("softmax", "group_limited_greedy", False, 4, 2, 16.0), 16, 3),
    ("qwen-norm", RouterConfig("softmax", "greedy", True), 8, 2),
    ("qwen-plain", RouterConfig("softmax", "greedy", False), 8, 2),
    ("sigmoid-greedy", RouterConfig("sigmoid", "greedy", True, routed_scaling_factor=1.5), 8, 3),
]
# (tokens, top_k, experts, hidden, intermediate): sizes not multiples of the 64-wide blocks.
MOE_CASES = [
    (0, 2, 4, 40, 20),  # no tokens: no launch
    (1, 1, 4, 33, 17),
    (1, 8, 16, 40, 20),
    (8, 2, 4, 70, 33),
    (8, 8, 16, 33, 70),
    (37, 1, 16, 40, 20),
    (37, 2, 4, 70, 33),
    (37, 8, 16, 33, 17),
]


def make_router(config: RouterConfig, num_experts: int, top_k: int) -> Router:
    """A ``Router`` with random weights (and a random V3 correction bias)."""
    model = ModelConfig(
        vocab_size=32,
        hidden_size=HIDDEN,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        head_dim=12,
        intermediate_size=32,
        num_experts=num_experts,
        top_k=top_k,
        moe_intermediate_size=16,
        router=config,
    )
    router = Router(model)
    with torch.no_grad():
        router.weight.normal_()
        if router.e_score_correction_bias is not None:
            router.e_score_correction_bias.normal_(0.0, 0.1)
    return router


def route_like(router: Router, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``route`` with ``router``'s settings."""
    cfg = router.config
    return route(
        logits,
        router.e_score_correction_bias,
        scoring=cfg.scoring,
        n_group=cfg.n_group,
        topk_group=cfg.topk_group,
        topk_method=cfg.topk_method,
        top_k=router.top_k,
        norm_topk_prob=cfg.norm_topk_prob,
        routed_scaling_factor=cfg.routed_scaling_factor,
    )


def make_ids(num_tokens: int, top_k: int, num_experts: int, seed: int = 0) -> torch.Tensor:
    """Distinct experts per token, as a router gives them."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)]
    return torch.stack(rows) if rows else torch.zeros(0, top_k, dtype=torch.long)


def reference_moe(
    x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    """The weighted SwiGLU experts, token by token."""
    inter = w2.shape[-1]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, expert in enumerate(ids[t].tolist()):
            gate = F.linear(x[t], w13[expert, :inter])
            up = F.linear(x[t], w13[expert, inter:])
            out[t] += weights[t, j] * F.linear(F.silu(gate) * up, w2[expert])
    return out


def make_moe(
    num_tokens: int, top_k: int, num_experts: int, hidden: int, inter: int, device: str
) -> tuple[torch.Tensor, ...]:
    """Seeded ``x, ids, weights, w13, w2``."""
    gen = torch.Generator().manual_seed(num_tokens * 1000 + top_k * 10 + num_experts)
    x = torch.randn(num_tokens, hidden, generator=gen)
    weights = torch.rand(num_tokens, top_k, generator=gen)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5
    ids = make_ids(num_tokens, top_k, num_experts)
    return tuple(t.to(device) for t in (x, ids, weights, w13, w2))


# --- the router ----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "config", "num_experts", "top_k"), ROUTER_CASES)
def test_route_matches_router(
    kernel_device: str, name: str, config: RouterConfig, num_experts: int, top_k: int
) -> None:
    torch.manual_seed(0)
    router = make_router(config, num_experts, top_k).to(kernel_device)
    x = torch.randn(37, HIDDEN, device=kernel_device)
    with torch.no_grad():
        want_w, want_ids = router(x)
        logits = F.linear(x.float(), router.weight.float())
        got_w, got_ids = route_like(router, logits)
    assert got_w.dtype == torch.float32 and got_ids.dtype == torch.int64
    assert got_ids.shape == want_ids.shape == (37, top_k)
    want_sorted, want_order = want_ids.sort(1)
    got_sorted, got_order = got_ids.sort(1)
    assert torch.equal(got_sorted, want_sorted), name
    torch.testing.assert_close(
        got_w.gather(1, got_order), want_w.gather(1, want_order), atol=1e-6, rtol=1e-6
    )  # relative too: V2 scales its weights by 16


def test_route_orders_by_choice_and_ties_go_to_the_lowest_id(kernel_device: str) -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, 2.0], [1.0] * 5], device=kernel_device)
    settings = {"n_group": 1, "topk_group": 1, "topk_method": "greedy", "top_k": 3}
    weights, ids = route(
        logits, None, scoring="softmax", norm_topk_prob=True, routed_scaling_factor=1.0, **settings
    )
    assert ids.tolist() == [[1, 3, 4], [0, 1, 2]]
    torch.testing.assert_close(weights[1], torch.full((3,), 1 / 3, device=kernel_device))


def test_route_without_tokens(kernel_device: str) -> None:
    config, num_experts, top_k = ROUTER_CASES[0][1:]
    router = make_router(config, num_experts, top_k).to(kernel_device)
    weights, ids = route_like(router, torch.zeros(0, num_experts, device=kernel_device))
    assert weights.shape == ids.shape == (0, top_k)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"scoring": "relu"}, "scoring 'relu'"),
        ({"topk_method": "aux_free"}, "topk_method 'aux_free'"),
        ({"n_group": 3}, "n_group 3"),
        ({"topk_group": 5}, "topk_group 5"),
        ({"top_k": 17}, "top_k 17"),
    ],
)
def test_route_refuses_what_it_cannot_compute(settings: dict[str, Any], message: str) -> None:
    base = {
        "scoring": "sigmoid",
        "n_group": 4,
        "topk_group": 2,
        "topk_method": "noaux_tc",
        "top_k": 4,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
    }
    with pytest.raises(ValueError, match=message):
        route(torch.zeros(2, 16), None, **{**base, **settings})


def test_supports_every_router_the_config_accepts() -> None:
    for _, config, _, _ in ROUTER_CASES:
        assert supports(config)
    assert not supports(types.SimpleNamespace(scoring="relu", topk_method="greedy"))


# --- the layout ----------------------------------------------------------------------------


def reference_layout(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[list, list]:
    """``(sorted_pairs, block_expert)`` up to the used length, in plain Python."""
    flat = ids.reshape(-1).tolist()
    sentinel = len(flat)
    pairs, blocks = [], []
    for expert in range(num_experts):
        run = [p for p, e in enumerate(flat) if e == expert]
        padded = -(-len(run) // block_m) * block_m
        pairs += run + [sentinel] * (padded - len(run))
        blocks += [expert] * (padded // block_m)
    return pairs, blocks


# (ids or (tokens, top_k) for random distinct ids, experts, block_m).
LAYOUT_CASES = [
    ([[2, 0], [2, 2], [1, 2]], 4, 4),  # expert 3 without pairs, a run of 4 exactly
    ([[3]], 4, 4),  # one token, one pair
    ((1, 8), 16, 16),  # one token, eight experts, eight without pairs
    ((37, 8), 16, 16),
    ((0, 2), 4, 16),  # no tokens: every block past the end
    ([[1, 1]] * 300, 4, 16),  # 600 pairs on one expert: runs past one scatter step
    ((5, 3), 3, 1),  # block_m 1: no padding
]


@pytest.mark.parametrize(("ids", "num_experts", "block_m"), LAYOUT_CASES)
def test_align_by_expert(kernel_device: str, ids: Any, num_experts: int, block_m: int) -> None:
    if isinstance(ids, tuple):
        ids = make_ids(*ids, num_experts)
    ids = torch.as_tensor(ids, dtype=torch.long)
    layout = align_by_expert(ids.to(kernel_device), num_experts, block_m)
    num_pairs = ids.numel()
    max_padded = -(-(num_pairs + num_experts * (block_m - 1)) // block_m) * block_m
    pairs, blocks = reference_layout(ids, num_experts, block_m)
    used = len(pairs)
    assert layout.num_pairs == num_pairs and layout.block_m == block_m
    assert layout.sorted_pairs.dtype == layout.block_expert.dtype == torch.int32
    assert layout.sorted_pairs.shape == (max_padded,)
    assert layout.block_expert.shape == (max_padded // block_m,)
    assert layout.num_padded.tolist() == [used]
    got_pairs, got_blocks = layout.sorted_pairs.tolist(), layout.block_expert.tolist()
    assert got_pairs[:used] == pairs  # grouped, ascending within a run, padded
    assert got_pairs[used:] == [num_pairs] * (max_padded - used)
    assert got_blocks == blocks + [-1] * (max_padded // block_m - len(blocks))
    assert sorted(p for p in got_pairs if p != num_pairs) == list(range(num_pairs))


# --- the fused experts ---------------------------------------------------------------------


@pytest.mark.parametrize(("num_tokens", "top_k", "num_experts", "hidden", "inter"), MOE_CASES)
def test_fused_moe_matches_reference(
    kernel_device: str, num_tokens: int, top_k: int, num_experts: int, hidden: int, inter: int
) -> None:
    x, ids, weights, w13, w2 = make_moe(
        num_tokens, top_k, num_experts, hidden, inter, kernel_device
    )
    out = fused_moe(x, ids, weights, w13, w2)
    assert out.shape == (num_tokens, hidden) and out.dtype == x.dtype
    want = reference_moe(x, ids, weights, w13, w2)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)


def test_fused_moe_skewed_and_strided(kernel_device: str) -> None:
    """Every pair on one expert; weights and x read through strides, not copies."""
    x, _, weights, w13, w2 = make_moe(20, 2, 4, 40, 20, kernel_device)
    ids = torch.tensor([[3, 1]] * 20, device=kernel_device)
    x_wide = torch.cat([x, x], dim=1)[:, :40]  # row stride 80
    weights_t = weights.t().contiguous().t()  # column-major [T, k]
    out = fused_moe(x_wide, ids, weights_t, w13, w2)
    torch.testing.assert_close(out, reference_moe(x, ids, weights, w13, w2), atol=1e-4, rtol=1e-4)


def test_fused_moe_bfloat16(kernel_device: str) -> None:
    if kernel_device != "cuda":
        pytest.skip("bfloat16 runs compiled, on CUDA")
    x, ids, weights, w13, w2 = make_moe(37, 8, 16, 136, 72, kernel_device)
    x, w13, w2 = x.bfloat16(), w13.bfloat16(), w2.bfloat16()
    out = fused_moe(x, ids, weights, w13, w2)
    assert out.dtype == torch.bfloat16
    want = reference_moe(x.float(), ids, weights, w13.float(), w2.float())
    torch.testing.assert_close(out.float(), want, atol=3e-2, rtol=3e-2)


def test_fused_moe_refuses_mismatched_shapes(kernel_device: str) -> None:
    x, ids, weights, w13, w2 = make_moe(3, 2, 4, 40, 20, kernel_device)
    with pytest.raises(ValueError, match="weights"):
        fused_moe(x, ids, weights[:, :1], w13, w2)
    with pytest.raises(ValueError, match="w13"):
        fused_moe(x, ids, weights, w13[:, :, :39], w2)


# --- op budgets, no host read, shape-only grids ------------------------------------------


@dataclass
class OpCount:
    """Aten calls and kernel launches seen while it was active, and each launch's grid."""

    ops: list[str] = field(default_factory=list)
    grids: list[tuple[int, ...]] = field(default_factory=list)
    launching: int = 0

    @property
    def total(self) -> int:
        return len(self.ops) + len(self.grids)


class _CountingMode(TorchDispatchMode):
    def __init__(self, count: OpCount) -> None:
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.count.launching:  # the interpreter's own copies are part of a launch
            self.count.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@contextmanager
def counting_ops(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpCount]:
    """Count ops and launches, and make any host read of a tensor outside a launch raise."""
    import triton.runtime.interpreter as interpreter
    from triton.runtime.jit import JITFunction

    count = OpCount()
    for cls in (interpreter.InterpretedFunction, JITFunction):
        run = cls.run

        def counted(self: Any, *args: Any, _run: Callable = run, **kwargs: Any) -> Any:
            grid = kwargs["grid"]
            if not count.launching:
                count.grids.append(tuple(grid(kwargs) if callable(grid) else grid))
            count.launching += 1
            try:
                return _run(self, *args, **kwargs)
            finally:
                count.launching -= 1

        monkeypatch.setattr(cls, "run", counted)
    for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
        read = getattr(torch.Tensor, name)

        def guarded(
            self: torch.Tensor, *args: Any, _read: Callable = read, _name: str = name
        ) -> Any:
            if not count.launching:
                raise AssertionError(f"host read: Tensor.{_name}")
            return _read(self, *args)

        monkeypatch.setattr(torch.Tensor, name, guarded)
    with _CountingMode(count):
        yield count
    monkeypatch.undo()


def test_route_budget(kernel_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config, num_experts, top_k = ROUTER_CASES[0][1:]
    router = make_router(config, num_experts, top_k).to(kernel_device)
    logits = torch.randn(8, num_experts, device=kernel_device)
    with torch.no_grad(), counting_ops(monkeypatch) as count:
        route_like(router, logits)
    assert len(count.grids) == 1 and count.total <= 3, count


@pytest.mark.parametrize("skewed", [False, True])
def test_fused_moe_budget_and_shape_only_grids(
    kernel_device: str, monkeypatch: pytest.MonkeyPatch, skewed: bool
) -> None:
    x, ids, weights, w13, w2 = make_moe(9, 2, 4, 40, 20, kernel_device)
    if skewed:  # every pair on one expert: the same launches, the same grids
        ids = torch.zeros_like(ids)
    with counting_ops(monkeypatch) as align_count:
        align_by_expert(ids, 4, BLOCK_M)
    with counting_ops(monkeypatch) as count:
        fused_moe(x, ids, weights, w13, w2)
    assert len(align_count.grids) == 1 and align_count.total <= 6, align_count
    assert len(count.grids) == 3 and count.total <= 12, count
    num_blocks = -(-(18 + 4 * (BLOCK_M - 1)) // BLOCK_M)
    assert count.grids == [(5,), (num_blocks, 1), (num_blocks, 1)]


def test_fused_moe_without_tokens_launches_nothing(
    kernel_device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, ids, weights, w13, w2 = make_moe(0, 2, 4, 40, 20, kernel_device)
    with counting_ops(monkeypatch) as count:
        out = fused_moe(x, ids, weights, w13, w2)
    assert out.shape == (0, 40) and count.grids == [] and count.total <= 1


# --- DeepEP's low-latency layout -----------------------------------------------------------


@pytest.mark.parametrize(("experts", "rows", "counts"), [(3, 5, [2, 0, 5]), (2, 20, [17, 1])])
def test_masked_experts_match_each_expert(
    kernel_device: str, experts: int, rows: int, counts: list[int]
) -> None:
    """Rows ``< counts[e]`` of ``packed[e]`` through expert ``e``, unweighted; rows past the
    counts are not the kernels' to write (the combine never reads them)."""
    hidden, inter = 24, 40
    gen = torch.Generator().manual_seed(rows)
    packed = torch.randn(experts, rows, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    device = [t.to(kernel_device) for t in (packed, w13, w2)]
    out = masked_experts(device[0], torch.tensor(counts, device=kernel_device), *device[1:])
    assert out.shape == packed.shape
    for e, count in enumerate(counts):
        ids = torch.full((count, 1), e)
        expected = reference_moe(packed[e, :count], ids, torch.ones(count, 1), w13, w2)
        torch.testing.assert_close(out[e, :count].cpu(), expected, atol=1e-4, rtol=1e-4)


def test_masked_experts_read_no_count(kernel_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    packed = torch.randn(4, 16, 8, device=kernel_device)
    w13, w2 = (
        torch.randn(4, 12, 8, device=kernel_device),
        torch.randn(4, 8, 6, device=kernel_device),
    )
    counts = torch.tensor([3, 16, 0, 1], device=kernel_device)
    masked_experts(packed, counts, w13, w2)  # the shape's tables, built once
    with counting_ops(monkeypatch) as count:
        masked_experts(packed, counts, w13, w2)
    assert count.total <= 10, count.ops
