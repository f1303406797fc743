"""MoE dispatch/combine: placement, backend choice, the local path, and DeepEP's mode choice.

DeepEP cannot be built on CPU, so a fake ``deep_ep`` module stands in: a one-rank buffer
that implements the real wire formats (normal: per token, unweighted combine; low-latency:
packed per expert, weighted combine) and logs which legs ran.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest
import torch
from builders import row
from model_driver import grow_pages, make_requests, make_runner

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.round import RoundPlan, ScheduledChunk
from roundgate.gate.rows import RankRow, read_rows
from roundgate.kernels.moe import registry
from roundgate.kernels.moe.base import run_experts
from roundgate.kernels.moe.deepep import DeepEPMoE
from roundgate.kernels.moe.local import LocalMoE
from roundgate.kernels.moe.placement import ExpertPlacement

# --- placement and selection ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("experts", "world", "rank", "local"),
    [(4, 1, 0, [0, 1, 2, 3]), (4, 2, 0, [0, 1]), (4, 2, 1, [2, 3]), (8, 4, 3, [6, 7])],
)
def test_contiguous_placement(experts: int, world: int, rank: int, local: list[int]) -> None:
    place = ExpertPlacement(experts, world, rank)
    assert list(place.local_experts) == local
    assert all(place.owner_of(e) == rank for e in local)


def test_placement_needs_divisible_experts() -> None:
    with pytest.raises(ValueError, match="divisible by --dp-size"):
        ExpertPlacement(4, 3, 0)


@pytest.mark.parametrize(
    ("name", "world", "device", "deep_ep", "expected"),
    [
        ("auto", 1, "cpu", False, "local"),
        ("auto", 2, "cpu", True, "torch"),
        ("auto", 2, "cuda", True, "deepep"),
        ("auto", 2, "cuda", False, "torch"),
        ("auto", 1, "cuda", True, "local"),
        ("torch", 1, "cpu", False, "local"),
        ("torch", 2, "cpu", False, "torch"),
        ("deepep", 2, "cuda", True, "deepep"),
    ],
)
def test_backend_resolution(name: str, world: int, device: str, deep_ep: bool, expected: str):
    assert registry.resolve_backend(name, world, device, lambda _: deep_ep) == expected


@pytest.mark.parametrize(
    ("name", "world", "device", "deep_ep", "message"),
    [
        ("local", 2, "cpu", False, "needs --dp-size 1"),
        ("deepep", 2, "cpu", True, "needs a CUDA device"),
        ("deepep", 2, "cuda", False, "not installed"),
        ("nccl", 2, "cuda", False, "must be one of"),
    ],
)
def test_backend_refusals_name_the_flag(name, world, device, deep_ep, message) -> None:
    with pytest.raises(ValueError, match=f"--moe-backend.*{message}"):
        registry.resolve_backend(name, world, device, lambda _: deep_ep)


# --- the local path ------------------------------------------------------------------------


def make_moe_inputs(tokens: int = 7, hidden: int = 16, experts: int = 4, top_k: int = 2):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen)
    ids = torch.argsort(torch.rand(tokens, experts, generator=gen), dim=1)[:, :top_k]
    weights = torch.rand(tokens, top_k, generator=gen)
    w13 = torch.randn(experts, 2 * 8, hidden, generator=gen)
    w2 = torch.randn(experts, hidden, 8, generator=gen)
    return x, ids, weights / weights.sum(1, keepdim=True), w13, w2


def naive_moe(x, ids, weights, w13, w2) -> torch.Tensor:
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate, up = (w13[e] @ x[t]).chunk(2)
            out[t] += weights[t, k] * (w2[e] @ (torch.nn.functional.silu(gate) * up))
    return out


def moe_forward(backend, x, ids, weights, w13, w2, low_latency: bool) -> torch.Tensor:
    dispatched = backend.dispatch(x, ids, weights, low_latency=low_latency)
    return backend.combine(run_experts(dispatched.hidden, dispatched.counts, w13, w2), dispatched)


@pytest.mark.parametrize("tokens", [0, 1, 7])
def test_local_backend_equals_naive_mixture(tokens: int) -> None:
    x, ids, weights, w13, w2 = make_moe_inputs(tokens)
    out = moe_forward(LocalMoE(ExpertPlacement(4)), x, ids, weights, w13, w2, False)
    torch.testing.assert_close(out, naive_moe(x, ids, weights, w13, w2), atol=1e-4, rtol=1e-4)


# --- DeepEP, faked ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """What DeepEP's kernels accept; the fake refuses the rest as DeepEP does (a RuntimeError
    from its ``EP_HOST_ASSERT``)."""

    hidden_sizes: frozenset[int]
    num_ranks: frozenset[int]
    dtypes: frozenset[torch.dtype]


# DeepEP v1.2.1's own, read off its source (not the adapter's): ``SWITCH_HIDDEN`` and
# ``SWITCH_RANKS``/``SWITCH_RDMA_RANKS`` in csrc/kernels/launch.cuh, bf16 asserted in
# csrc/deep_ep.cpp's low-latency legs and the only ``SWITCH_TYPES`` case of the combines.
DEEPEP = Envelope(
    frozenset({2048, 2560, 4096, 5120, 6144, 7168, 8192}),
    frozenset({2, 4, 8, 16, 32, 64, 128, 144, 160}),
    frozenset({torch.bfloat16}),
)
# Test-only: the toy shapes these tests run on one CPU rank (hidden 16 here, 128 in the
# tiny-moe runner, float32), added to DeepEP's envelope on both sides: ``FakeBuffer`` and the
# adapter (``ToyDeepEPMoE``).
TOY = Envelope(
    DEEPEP.hidden_sizes | {16, 128}, DEEPEP.num_ranks | {1}, DEEPEP.dtypes | {torch.float32}
)
MAX_TOPK = 11  # kNumMaxTopK of the low-latency dispatch (csrc/kernels/internode_ll.cu)
ALIGNMENT = 128  # NUM_BUFFER_ALIGNMENT_BYTES: both buffer sizes are multiples of it


def refuse_unless(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"DeepEP (fake): {what}")


class FakeBuffer:
    """One-rank ``deep_ep.Buffer``: local expert ids equal global ones, nothing travels. It
    checks its inputs as DeepEP's buffer and kernels do, within ``envelope``."""

    envelope = DEEPEP

    def __init__(
        self, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, **kw
    ) -> None:
        self.num_ranks = 1 if group is None else group.size()
        refuse_unless(
            self.num_ranks in self.envelope.num_ranks,
            f"Unsupported number of EP ranks: {self.num_ranks}",
        )
        refuse_unless(num_nvl_bytes % ALIGNMENT == 0, "num_nvl_bytes not aligned")
        refuse_unless(num_rdma_bytes % ALIGNMENT == 0, "num_rdma_bytes not aligned")
        refuse_unless(not low_latency_mode or kw.get("num_qps_per_rank", 24) > 0, "no QPs")
        self.low_latency_mode = low_latency_mode
        self.num_rdma_bytes = num_rdma_bytes
        self.calls: list[str] = []

    @staticmethod
    def get_low_latency_rdma_size_hint(cap: int, hidden: int, ranks: int, experts: int) -> int:
        return -(-cap * hidden * ranks * experts // ALIGNMENT) * ALIGNMENT

    def _check_rows(self, x: torch.Tensor, hidden_switch: bool) -> None:
        refuse_unless(x.dim() == 2 and x.is_contiguous(), "x must be 2-D contiguous")
        refuse_unless(x.dtype in self.envelope.dtypes, f"Unsupported type {x.dtype}")
        refuse_unless(x.shape[1] * x.element_size() % 16 == 0, "hidden bytes not int4-aligned")
        if hidden_switch:
            refuse_unless(x.shape[1] in self.envelope.hidden_sizes, "Unsupported hidden")

    def _check_topk(self, topk_idx: torch.Tensor, topk_weights=None) -> None:
        refuse_unless(topk_idx.dim() == 2 and topk_idx.is_contiguous(), "topk_idx layout")
        refuse_unless(topk_idx.dtype == torch.int64, "topk_idx must be int64")
        if topk_weights is not None:
            refuse_unless(topk_weights.dtype == torch.float32, "topk_weights must be float32")

    def get_dispatch_layout(self, topk_idx, num_experts):
        self._check_topk(topk_idx)
        refuse_unless(num_experts > 0, "num_experts must be positive")
        self.calls.append("layout")
        per_expert = torch.bincount(topk_idx.flatten(), minlength=num_experts)
        in_rank = torch.ones(topk_idx.shape[0], 1, dtype=torch.bool)
        return torch.tensor([topk_idx.shape[0]]), None, per_expert, in_rank, None

    def dispatch(self, x, *, topk_idx, topk_weights, num_tokens_per_expert, **layout):
        self._check_rows(x, hidden_switch=False)
        self._check_topk(topk_idx, topk_weights)
        self.calls.append("dispatch")
        counts = num_tokens_per_expert.tolist()
        return x.clone(), topk_idx.clone(), topk_weights.clone(), counts, "handle", None

    def combine(self, x, handle):
        self._check_rows(x, hidden_switch=False)
        self.calls.append("combine")
        return x.clone(), None, None

    def clean_low_latency_buffer(self, cap, hidden, num_experts):
        refuse_unless(self.low_latency_mode, "low-latency mode is off")
        self.calls.append("clean")

    def low_latency_dispatch(self, x, topk_idx, cap, num_experts, use_fp8=True):
        refuse_unless(self.low_latency_mode, "low-latency mode is off")
        self._check_rows(x, hidden_switch=True)
        self._check_topk(topk_idx)
        refuse_unless(x.shape[0] == topk_idx.shape[0] and x.shape[0] <= cap, "tokens over cap")
        refuse_unless(num_experts % self.num_ranks == 0, "experts not divisible by ranks")
        refuse_unless(topk_idx.shape[1] <= MAX_TOPK, "top-k over kNumMaxTopK")
        need = self.get_low_latency_rdma_size_hint(cap, x.shape[1], self.num_ranks, num_experts)
        refuse_unless(need <= self.num_rdma_bytes, "RDMA buffer too small")
        assert not use_fp8  # the adapter moves bf16 (the fake has no FP8 cast)
        self.calls.append("ll_dispatch")
        packed = x.new_zeros(num_experts, cap, x.shape[1])
        sources = [(topk_idx == e).any(1).nonzero().flatten() for e in range(num_experts)]
        for e, tokens in enumerate(sources):
            packed[e, : len(tokens)] = x[tokens]
        counts = torch.tensor([len(t) for t in sources], dtype=torch.int32)
        return packed, counts, sources, None, None

    def low_latency_combine(self, x, topk_idx, topk_weights, handle):
        refuse_unless(self.low_latency_mode, "low-latency mode is off")
        refuse_unless(x.dim() == 3 and x.is_contiguous(), "x must be 3-D contiguous")
        refuse_unless(x.dtype in self.envelope.dtypes, f"Unsupported type {x.dtype}")
        refuse_unless(x.shape[2] in self.envelope.hidden_sizes, "Unsupported hidden")
        self._check_topk(topk_idx, topk_weights)
        self.calls.append("ll_combine")
        out = x.new_zeros(topk_idx.shape[0], x.shape[2])
        for e, tokens in enumerate(handle):
            for j, t in enumerate(tokens.tolist()):
                slot = int((topk_idx[t] == e).nonzero()[0])
                out[t] += topk_weights[t, slot] * x[e, j]
        return out, None, None


class ToyFakeBuffer(FakeBuffer):
    envelope = TOY


class ToyDeepEPMoE(DeepEPMoE):
    """Test-only: the adapter with its envelope widened to the toy shapes, as the fake's."""

    supported_hidden_sizes = TOY.hidden_sizes
    supported_num_ranks = TOY.num_ranks
    activation_dtypes = TOY.dtypes


FAKE_DEEP_EP = types.SimpleNamespace(Buffer=ToyFakeBuffer)
STRICT_DEEP_EP = types.SimpleNamespace(Buffer=FakeBuffer)


def make_deepep(cap: int = 64) -> DeepEPMoE:
    return ToyDeepEPMoE(ExpertPlacement(4), None, 16, cap, deep_ep=FAKE_DEEP_EP)


@pytest.mark.parametrize(
    ("rows", "legs"),
    [
        ([row(), row()], ["ll_dispatch", "ll_combine"]),  # all decode
        ([row(), row(decodes=False)], ["ll_dispatch", "ll_combine"]),  # decode + idle
        ([row(decodes=False), row(decodes=False)], ["ll_dispatch", "ll_combine"]),  # all idle
        ([row(), row(extends=1)], ["layout", "dispatch", "combine"]),  # another rank extends
        ([row(extends=2), row()], ["layout", "dispatch", "combine"]),  # this rank extends
    ],
)
def test_deepep_legs_follow_the_gathered_rows(rows: list[RankRow], legs: list[str]) -> None:
    moe = make_deepep()
    x, ids, weights, w13, w2 = make_moe_inputs()
    out = moe_forward(moe, x, ids, weights, w13, w2, read_rows(rows).low_latency)
    assert moe.buffer.calls == legs
    assert moe.buffer.low_latency_mode  # one buffer serves both modes
    # Both wire formats compute the same mixture.
    torch.testing.assert_close(out, naive_moe(x, ids, weights, w13, w2), atol=1e-4, rtol=1e-4)


def test_low_latency_after_normal_cleans_the_buffer() -> None:
    moe = make_deepep()
    x, ids, weights, w13, w2 = make_moe_inputs()
    for low_latency in (False, True, True):
        moe_forward(moe, x, ids, weights, w13, w2, low_latency)
    assert moe.buffer.calls == [
        *["layout", "dispatch", "combine"],
        *["clean", "ll_dispatch", "ll_combine"],
        *["ll_dispatch", "ll_combine"],
    ]


def test_low_latency_refuses_more_tokens_than_the_cap() -> None:
    x, ids, weights, _, _ = make_moe_inputs(tokens=7)
    with pytest.raises(ValueError, match="exceeds the per-rank cap 4"):
        make_deepep(cap=4).dispatch(x, ids, weights, low_latency=True)


def test_the_buffer_is_built_at_construction_once() -> None:
    built: list[FakeBuffer] = []

    class Counting(ToyFakeBuffer):
        def __init__(self, *args, **kw) -> None:
            super().__init__(*args, **kw)
            built.append(self)

    moe = ToyDeepEPMoE(
        ExpertPlacement(4), None, 16, 64, deep_ep=types.SimpleNamespace(Buffer=Counting)
    )
    assert len(built) == 1 and moe.buffer is built[0] and built[0].calls == []
    x, ids, weights, w13, w2 = make_moe_inputs()
    moe_forward(moe, x, ids, weights, w13, w2, low_latency=True)
    assert len(built) == 1 and moe.buffer is built[0]


def test_the_adapter_checks_deepeps_own_envelope() -> None:
    assert DeepEPMoE.supported_hidden_sizes == DEEPEP.hidden_sizes
    assert DeepEPMoE.supported_num_ranks == DEEPEP.num_ranks
    assert DeepEPMoE.activation_dtypes == DEEPEP.dtypes


@pytest.mark.parametrize(
    ("placement", "hidden", "cap", "message"),
    [
        (ExpertPlacement(8, 8, 0), 16, 64, "hidden_size 16 is not one DeepEP"),
        (ExpertPlacement(8, 8, 0), 7000, 64, "hidden_size 7000"),
        (ExpertPlacement(8, 1, 0), 7168, 64, "groups of 2, 4, 8, .* got --dp-size 1"),
        (ExpertPlacement(6, 6, 0), 7168, 64, "got --dp-size 6"),
        (ExpertPlacement(8, 8, 0), 7168, 0, r"positive per-rank token cap .*--max-num-seqs"),
    ],
)
def test_deepep_refuses_what_its_kernels_cannot_run(placement, hidden, cap, message) -> None:
    """At construction, before ``deep_ep`` is imported or a buffer built."""
    with pytest.raises(ValueError, match=message):
        DeepEPMoE(placement, None, hidden, cap, deep_ep=STRICT_DEEP_EP)


@pytest.mark.parametrize("low_latency", [True, False])
def test_deepep_dispatch_names_a_dtype_it_cannot_move(low_latency: bool) -> None:
    x, ids, weights, _, _ = make_moe_inputs()
    with pytest.raises(ValueError, match=r"torch.bfloat16, torch.float32 .* got torch.float16"):
        make_deepep().dispatch(x.half(), ids, weights, low_latency=low_latency)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: FakeBuffer(None, low_latency_mode=True), "Unsupported number of EP ranks: 1"),
        (lambda: ToyFakeBuffer(None, num_nvl_bytes=100), "num_nvl_bytes not aligned"),
        (
            lambda: ToyFakeBuffer(None, low_latency_mode=False).low_latency_dispatch(
                torch.zeros(1, 2048), torch.zeros(1, 2, dtype=torch.int64), 8, 4, use_fp8=False
            ),
            "low-latency mode is off",
        ),
        (
            lambda: ToyFakeBuffer(None, 0, 1 << 20, True).low_latency_dispatch(
                torch.zeros(1, 2000), torch.zeros(1, 2, dtype=torch.int64), 8, 4, use_fp8=False
            ),
            "Unsupported hidden",
        ),
        (
            lambda: ToyFakeBuffer(None, 0, 1 << 20, True).low_latency_dispatch(
                torch.zeros(1, 16), torch.zeros(1, 2, dtype=torch.int32), 8, 4, use_fp8=False
            ),
            "topk_idx must be int64",
        ),
        (
            lambda: ToyFakeBuffer(None, 0, 128, True).low_latency_dispatch(
                torch.zeros(1, 16), torch.zeros(1, 2, dtype=torch.int64), 8, 4, use_fp8=False
            ),
            "RDMA buffer too small",
        ),
    ],
)
def test_the_fake_refuses_what_deepep_refuses(call, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        call()


@pytest.mark.parametrize("with_view", [False, True])
@pytest.mark.parametrize(
    ("peer", "legs"),
    [(row(), "ll_dispatch"), (row(extends=1), "dispatch")],
)
def test_runner_passes_the_rows_decision_to_deepep(
    peer: RankRow, legs: str, with_view: bool
) -> None:
    """Through ModelRunner.execute: this rank decodes; the peer's row picks the legs (read from
    the rows, or given as the round's view, as ``RankLoop`` passes it)."""
    runner, pool = make_runner("tiny-moe"), KVPool(PoolConfig(256, 4))
    (request,) = make_requests([[1, 2, 3, 4, 5]])
    grow_pages(pool, request, request.num_tokens)
    runner.execute(RoundPlan(chunks=[ScheduledChunk(request, 0, 5, True)]))
    request.num_computed_tokens = 4  # decode the last prompt token again
    runner.moe = ToyDeepEPMoE(runner.placement, None, 128, 8, deep_ep=FAKE_DEEP_EP)
    plan = RoundPlan(chunks=[ScheduledChunk(request, 4, 1, False)])
    rows = [row(), peer]
    if with_view:
        runner.execute(plan, (), read_rows(rows))  # the view alone decides
    else:
        runner.execute(plan, rows)
    layers = runner.config.num_layers
    assert runner.moe.buffer.calls.count(legs) == layers
    assert len(runner.moe.buffer.calls) == layers * (2 if legs == "ll_dispatch" else 3)


@pytest.mark.triton
@pytest.mark.parametrize("low_latency", [True, False])
def test_deepep_masked_experts_read_no_count(kernel_device: str, low_latency: bool) -> None:
    """With the masked experts the low-latency legs hand over DeepEP's packed layout and its
    device counts: nothing of ours reads them to the host (the fake buffer's own bookkeeping
    aside), so the legs are graph-safe; the normal legs (extend rounds) are unchanged."""
    from roundgate.kernels.dispatch_count import DispatchCount
    from roundgate.kernels.moe.triton_fused_moe import masked_experts

    moe = make_deepep()
    assert not moe.is_graph_safe
    assert moe.take_masked_experts() and moe.is_graph_safe
    x, ids, weights, w13, w2 = make_moe_inputs()
    with DispatchCount() as tally:
        dispatched = moe.dispatch(x, ids, weights, low_latency=low_latency)
        if low_latency:
            assert dispatched.device_counts is not None and not dispatched.counts
            rows = masked_experts(dispatched.hidden, dispatched.device_counts, w13, w2)
        else:
            rows = run_experts(dispatched.hidden, dispatched.counts, w13, w2)
        out = moe.combine(rows, dispatched)
    ours = [site for site in tally.host_reads if "test_moe.py" not in site]
    assert (ours == []) == low_latency, tally.host_reads
    torch.testing.assert_close(out, naive_moe(x, ids, weights, w13, w2), atol=1e-4, rtol=1e-4)


@pytest.mark.triton
def test_runner_offers_deepep_the_masked_experts(kernel_device: str) -> None:
    """The runner's Triton experts take DeepEP's masked layout; the torch ones cannot."""
    for kernel, masked in (("triton", True), ("torch", False)):
        runner = make_runner("tiny-moe", moe_kernel=kernel)
        runner.moe = ToyDeepEPMoE(runner.placement, None, 128, 8, deep_ep=FAKE_DEEP_EP)
        runner._fuse()
        assert runner.moe.masked is masked
        assert runner.fused.moe_graph_safe(runner.moe) is masked
    # A decode through the masked legs gives the local backend's logits.
    pool = KVPool(PoolConfig(256, 4))
    (request,) = make_requests([[1, 2, 3, 4, 5]])
    grow_pages(pool, request, request.num_tokens)
    prefill = [ScheduledChunk(request, 0, 4, True)]
    decode = [ScheduledChunk(request, 4, 1, False)]
    local = make_runner("tiny-moe", moe_kernel="triton")
    expected = (local.forward(prefill), local.forward(decode, low_latency=True))
    masked = make_runner("tiny-moe", moe_kernel="triton")
    masked.moe = ToyDeepEPMoE(masked.placement, None, 128, 8, deep_ep=FAKE_DEEP_EP)
    masked._fuse()
    got = (masked.forward(prefill, low_latency=False), masked.forward(decode, low_latency=True))
    assert masked.moe.buffer.calls.count("ll_dispatch") == masked.config.num_layers
    for ours, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


# --- redundant experts: every backend reads the physical slots --------------------------------

SLOTS = (0, 1, 2, 3, 0, 1)  # experts 0 and 1 have a second copy in slots 4 and 5


def _physical_inputs(tokens: int):
    """The mixture's inputs with ids mapped to slots (``ExpertMap``) and weights per slot."""
    from roundgate.kernels.moe.expert_map import ExpertMap

    x, ids, weights, w13, w2 = make_moe_inputs(tokens)
    expert_map = ExpertMap(ExpertPlacement(4, 1, 0, 2), SLOTS)
    slots = expert_map.to_physical(ids, torch.arange(tokens))
    index = torch.tensor(SLOTS)
    return x, ids, slots, weights, w13, w2, w13[index], w2[index]


@pytest.mark.parametrize(
    ("backend", "low_latency"),
    [("local", False), ("deepep", False), ("deepep", True)],
)
def test_backends_on_redundant_slots_equal_the_logical_mixture(
    backend: str, low_latency: bool
) -> None:
    x, ids, slots, weights, w13, w2, slot_w13, slot_w2 = _physical_inputs(9)
    assert set(slots.flatten().tolist()) & {4, 5}, "no token used a second copy"
    place = ExpertPlacement(4, 1, 0, 2)
    moe = (
        LocalMoE(place)
        if backend == "local"
        else ToyDeepEPMoE(place, None, 16, 64, deep_ep=FAKE_DEEP_EP)
    )
    out = moe_forward(moe, x, slots, weights, slot_w13, slot_w2, low_latency)
    torch.testing.assert_close(out, naive_moe(x, ids, weights, w13, w2), atol=1e-4, rtol=1e-4)


@pytest.mark.triton
def test_triton_experts_on_redundant_slots_equal_the_logical_mixture(kernel_device: str) -> None:
    """The fused expert kernel runs a rank's slots, second copies included."""
    from roundgate.kernels.moe.triton_experts import triton_run_experts

    x, ids, slots, weights, w13, w2, slot_w13, slot_w2 = _physical_inputs(9)
    expected = naive_moe(x, ids, weights, w13, w2)
    x, slots, weights, slot_w13, slot_w2 = (
        t.to(kernel_device) for t in (x, slots, weights, slot_w13, slot_w2)
    )
    moe = LocalMoE(ExpertPlacement(4, 1, 0, 2))
    dispatched = moe.dispatch(x, slots, weights, low_latency=False)
    hidden = triton_run_experts(dispatched.hidden, dispatched.counts, slot_w13, slot_w2)
    out = moe.combine(hidden, dispatched).cpu()
    torch.testing.assert_close(out, expected, atol=1e-3, rtol=1e-3)
