"""The fused per-layer kernels against the torch layers they replace, and what they dispatch.

Each kernel is compared with the code it stands in for: ``RMSNorm`` (with and without the
residual add), ``F.silu(gate) * up``, and for ``mla_prep`` what ``MLAttention.forward`` and
``PagedKVCache.write_latent`` compute (the latent norm, ``apply_rope`` on ``q_pe`` and
``k_pe``, the cache row). Shapes cover odd widths (7, 33, 129), a row past ``MAX_BLOCK``
(the looped norm), one, three and sixteen heads, rope dims 8 and 64, and zero, one and five
tokens. The op-count test holds each function to its dispatch budget and checks that none
reads a device value back (``.item()``, ``.tolist()``, or the ``_local_scalar_dense`` under
``int()``/``bool()``), which would stall the stream and break a CUDA graph capture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from roundgate.actors.model.layers import RMSNorm
from roundgate.actors.model.rope import RotaryTable, apply_rope
from roundgate.kernels.attention.batch import PagedKVCache

pytestmark = pytest.mark.triton

EPS = 1e-6
# (tokens, width): odd widths, a DeepSeek-V3 hidden row, one past MAX_BLOCK, no rows.
NORM_CASES = [(1, 7), (5, 33), (3, 129), (2, 7168), (2, 16385), (0, 33)]
# (tokens, intermediate): odd sizes, one past a 1024-column block, no rows.
ACT_CASES = [(1, 7), (5, 33), (3, 1025), (0, 16)]
# (tokens, heads, nope dim, kv_lora_rank, rope dim, page_size).
MLA_CASES = [
    (1, 1, 12, 16, 8, 1),  # one token, one head
    (5, 3, 12, 33, 8, 4),  # odd heads and rank
    (5, 16, 16, 129, 64, 16),  # a full head block, DeepSeek's rope dim
    (3, 17, 8, 64, 64, 2),  # one head past a 16-head block
    (2, 128, 128, 512, 64, 64),  # DeepSeek-V3's heads and widths
    (0, 3, 12, 16, 8, 4),  # no tokens
]


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """float32: rounding only; bfloat16: one unit in the last place."""
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def dtype(request: pytest.FixtureRequest, kernel_device: str) -> torch.dtype:
    """float32 everywhere; bfloat16 only compiled (the interpreter's numpy has no bfloat16)."""
    if request.param == torch.bfloat16 and kernel_device != "cuda":
        pytest.skip("bfloat16 runs on CUDA only")
    return request.param


def make_norm(width: int, dtype: torch.dtype, device: str) -> RMSNorm:
    norm = RMSNorm(width, EPS)
    norm.weight.data.copy_(torch.rand(width) + 0.5)
    return norm.to(device=device, dtype=dtype)


@pytest.mark.parametrize(("tokens", "width"), NORM_CASES)
def test_rms_norm_matches_the_layer(
    tokens: int, width: int, dtype: torch.dtype, kernel_device: str
) -> None:
    from roundgate.kernels.fused.triton_norm import rms_norm

    torch.manual_seed(width)
    norm = make_norm(width, dtype, kernel_device)
    x = (torch.randn(tokens, width) * 3).to(device=kernel_device, dtype=dtype)
    torch.testing.assert_close(rms_norm(x, norm.weight, EPS), norm(x), **tolerance(dtype))


def test_rms_norm_reads_a_strided_row_view(kernel_device: str) -> None:
    from roundgate.kernels.fused.triton_norm import rms_norm

    norm = make_norm(33, torch.float32, kernel_device)
    wide = torch.randn(4, 50, device=kernel_device)
    x = wide[:, 10:43]  # row stride 50, last dim contiguous: read in place
    torch.testing.assert_close(rms_norm(x, norm.weight, EPS), norm(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("tokens", "width"), NORM_CASES)
def test_add_rms_norm_matches_add_then_layer(
    tokens: int, width: int, dtype: torch.dtype, kernel_device: str
) -> None:
    from roundgate.kernels.fused.triton_norm import add_rms_norm

    torch.manual_seed(width + 1)
    norm = make_norm(width, dtype, kernel_device)
    x = torch.randn(tokens, width).to(device=kernel_device, dtype=dtype)
    residual = torch.randn(tokens, width).to(device=kernel_device, dtype=dtype)
    inputs = (x.clone(), residual.clone())
    normed, summed = add_rms_norm(x, residual, norm.weight, EPS)
    torch.testing.assert_close(summed, residual + x, atol=0, rtol=0)
    torch.testing.assert_close(normed, norm(residual + x), **tolerance(dtype))
    torch.testing.assert_close((x, residual), inputs, atol=0, rtol=0)  # inputs untouched


@pytest.mark.parametrize(("tokens", "inter"), ACT_CASES)
def test_silu_mul_matches_torch(
    tokens: int, inter: int, dtype: torch.dtype, kernel_device: str
) -> None:
    from roundgate.kernels.fused.triton_act import silu_mul

    torch.manual_seed(inter)
    gate_up = (torch.randn(tokens, 2 * inter) * 4).to(device=kernel_device, dtype=dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(gate_up), F.silu(gate) * up, **tolerance(dtype))


def make_mla_inputs(
    case: tuple[int, ...], dtype: torch.dtype, device: str
) -> tuple[dict[str, Any], PagedKVCache, RMSNorm]:
    """Random projections, real RoPE tables at random positions, distinct random slots."""
    tokens, heads, nope, rank, rope, page_size = case
    torch.manual_seed(sum(case))
    num_pages = 4 + tokens
    cache = PagedKVCache.allocate_latent(1, num_pages, page_size, rank + rope, dtype, device)
    norm = make_norm(rank, dtype, device)
    table = RotaryTable(rope, 4096, 10000.0).to(device)
    cos, signed_sin = table.lookup(torch.randint(0, 4096, (tokens,), device=device), dtype)
    inputs = {
        "q": torch.randn(tokens, heads * (nope + rope)).to(device=device, dtype=dtype),
        "kv": (torch.randn(tokens, rank + rope) * 2).to(device=device, dtype=dtype),
        "cos": cos,
        "signed_sin": signed_sin,
        "slot_mapping": torch.randperm(num_pages * page_size, device=device)[:tokens],
    }
    inputs["q"] = inputs["q"].view(tokens, heads, nope + rope)
    return inputs, cache, norm


def mla_reference(inputs: dict[str, Any], cache: PagedKVCache, norm: RMSNorm) -> torch.Tensor:
    """``MLAttention.forward``'s steps up to the backend, and the backend's cache write."""
    q, kv, cos, sin = inputs["q"], inputs["kv"], inputs["cos"], inputs["signed_sin"]
    rope = cos.shape[-1]
    q_nope, q_pe = q.split([q.shape[-1] - rope, rope], dim=-1)
    latent, k_pe = kv.split([norm.weight.shape[0], rope], dim=-1)
    latent = norm(latent)
    q_pe = apply_rope(q_pe, cos, sin)
    k_pe = apply_rope(k_pe.unsqueeze(1), cos, sin).squeeze(1)
    cache.write_latent(0, inputs["slot_mapping"], torch.cat((latent, k_pe), dim=-1))
    return torch.cat((q_nope, q_pe), dim=-1)


@pytest.mark.parametrize("case", MLA_CASES, ids=str)
def test_mla_prep_matches_forward_and_cache_write(
    case: tuple[int, ...], dtype: torch.dtype, kernel_device: str
) -> None:
    from roundgate.kernels.attention.triton_mla_prep import mla_prep

    inputs, cache, norm = make_mla_inputs(case, dtype, kernel_device)
    expected_cache = PagedKVCache.allocate_latent(
        1, cache.num_pages, cache.page_size, cache.k[0].shape[-1], dtype, kernel_device
    )
    expected_q = mla_reference(inputs, expected_cache, norm)
    mla_prep(norm_weight=norm.weight, eps=EPS, cache_layer=cache.k[0], **inputs)
    tol = {"atol": 1e-6, "rtol": 1e-6} if dtype == torch.float32 else tolerance(dtype)
    torch.testing.assert_close(inputs["q"], expected_q, **tol)
    # Every slot: the written rows, and the others still zero.
    torch.testing.assert_close(cache.k[0], expected_cache.k[0], **tolerance(dtype))


class DispatchCounter(TorchDispatchMode):
    """Counts every torch op and every top-level Triton launch; ops the interpreter runs
    inside a launch (its host copies) belong to that launch and are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.launch_depth = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if not self.launch_depth:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@contextmanager
def counting_dispatches(monkeypatch: pytest.MonkeyPatch) -> Iterator[DispatchCounter]:
    """A ``DispatchCounter`` active, with launches counted and host readbacks refused."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    counter = DispatchCounter()

    def counted(run: Callable[..., Any]) -> Callable[..., Any]:
        def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not counter.launch_depth:
                counter.ops.append(f"launch {self.__name__}")
            counter.launch_depth += 1
            try:
                return run(self, *args, **kwargs)
            finally:
                counter.launch_depth -= 1

        return launch

    def refused(name: str) -> Callable[..., Any]:
        original = getattr(torch.Tensor, name)

        def readback(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not counter.launch_depth:
                raise AssertionError(f"Tensor.{name} called: a device value read to the host")
            return original(self, *args, **kwargs)

        return readback

    monkeypatch.setattr(InterpretedFunction, "run", counted(InterpretedFunction.run))
    monkeypatch.setattr(JITFunction, "run", counted(JITFunction.run))
    for name in ("item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, refused(name))
    try:
        with counter:
            yield counter
    finally:
        monkeypatch.undo()


def ops_of(call: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ``call`` dispatches, after one warm-up call (the first launch compiles)."""
    call()
    with counting_dispatches(monkeypatch) as counter:
        call()
    return counter.ops


def test_each_function_keeps_its_dispatch_budget(
    kernel_device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from roundgate.kernels.attention.triton_mla_prep import mla_prep
    from roundgate.kernels.fused.triton_act import silu_mul
    from roundgate.kernels.fused.triton_norm import add_rms_norm, rms_norm

    x = torch.randn(3, 33, device=kernel_device)
    residual = torch.randn(3, 33, device=kernel_device)
    weight = torch.rand(33, device=kernel_device)
    gate_up = torch.cat((x, residual), dim=-1)
    inputs, cache, norm = make_mla_inputs((3, 3, 12, 16, 8, 4), torch.float32, kernel_device)
    calls: dict[str, tuple[Callable[[], Any], int]] = {
        "rms_norm": (lambda: rms_norm(x, weight, EPS), 2),
        "add_rms_norm": (lambda: add_rms_norm(x, residual, weight, EPS), 3),
        "silu_mul": (lambda: silu_mul(gate_up), 2),
        "mla_prep": (
            lambda: mla_prep(norm_weight=norm.weight, eps=EPS, cache_layer=cache.k[0], **inputs),
            1,
        ),
    }
    for name, (call, budget) in calls.items():
        ops = ops_of(call, monkeypatch)
        assert sum(op.startswith("launch") for op in ops) == 1, (name, ops)
        assert len(ops) <= budget, (name, ops)
        assert not any("_local_scalar_dense" in op for op in ops), (name, ops)


def test_no_rows_launch_nothing(kernel_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from roundgate.kernels.attention.triton_mla_prep import mla_prep
    from roundgate.kernels.fused.triton_act import silu_mul
    from roundgate.kernels.fused.triton_norm import add_rms_norm, rms_norm

    x = torch.randn(0, 33, device=kernel_device)
    weight = torch.rand(33, device=kernel_device)
    inputs, cache, norm = make_mla_inputs((0, 3, 12, 16, 8, 4), torch.float32, kernel_device)
    calls = [
        lambda: rms_norm(x, weight, EPS),
        lambda: add_rms_norm(x, x, weight, EPS),
        lambda: silu_mul(torch.empty(0, 66, device=kernel_device)),
        lambda: mla_prep(norm_weight=norm.weight, eps=EPS, cache_layer=cache.k[0], **inputs),
    ]
    for call in calls:
        assert not any(op.startswith("launch") for op in ops_of(call, monkeypatch))


def test_the_readback_guard_catches_item(
    kernel_device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard itself: a function that reads a value back fails the budget test."""
    x = torch.ones(2, device=kernel_device)
    with pytest.raises(AssertionError, match=r"Tensor\.item"), counting_dispatches(monkeypatch):
        x.sum().item()
    with counting_dispatches(monkeypatch) as counter:
        int(x.sum())
    assert any("_local_scalar_dense" in op for op in counter.ops)
