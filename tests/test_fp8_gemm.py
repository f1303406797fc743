"""The block-FP8 GEMM against its torch references, the quantize step's rounding, ``Fp8Linear``
and the FP8 weight bytes of DeepSeek-V3 per rank.

Without a GPU the Triton kernels run under Triton's interpreter (``kernel_device``), on tiny
shapes that still cover ``N`` and ``K`` off multiples of 128, each tile configuration and
empty inputs. Tolerances are bounds derived from the arithmetic (``triton_fp8_gemm``'s
docstring), not fitted to the results: float32 summation order against the reference that
quantizes ``x`` the same way, and e4m3's rounding of ``x`` against the unquantized product.
"""

from __future__ import annotations

import pytest
import torch

from roundgate.kernels.quant.fp8_blocks import (
    AMAX_FLOOR,
    BLOCK,
    FP8_DTYPE,
    FP8_MAX,
    QuantizedActivations,
    dequantize_weight_blocks,
    dequantized_linear,
    fp8_gemm_reference,
    quantize_activations,
    quantize_weight_blocks,
)
from roundgate.kernels.quant.fp8_footprint import MoEShape, weight_bytes_per_rank
from roundgate.kernels.quant.fp8_linear import Fp8Linear

# The accumulator's unit roundoff, by device: float32 under the interpreter (numpy); on a
# GPU, Hopper's FP8 tensor cores keep about 14 bits while summing inside one 128-wide step
# (DeepSeek-V3's report, section 3.3.2; the reason the kernel rescales into float32 every
# step). Not checked on a GPU here: this task's machine has none.
ACCUMULATOR_UNIT = {"cpu": 2.0**-24, "cuda": 2.0**-13}
UNIT = 2.0**-24  # float32's unit roundoff (stores, the reference's own products)
E4M3_UNIT = 2.0**-4  # e4m3 keeps 3 mantissa bits: relative rounding error of normal values
E4M3_SUBNORMAL_HALF_STEP = 2.0**-10  # absolute error below e4m3's smallest normal, in codes

# (rows, out features N, in features K, x dtype)
GEMM_CASES = [
    (1, 128, 128, torch.bfloat16),  # one decode row, one block
    (5, 200, 300, torch.bfloat16),  # N and K off multiples of 128: partial edge blocks
    (3, 130, 7, torch.float32),  # K under one group
    (20, 64, 256, torch.float16),  # 17-64 rows: the 64x128 tiles
    (70, 40, 130, torch.bfloat16),  # over 64 rows: the 128x128 tiles
    (0, 64, 128, torch.bfloat16),  # no rows (an idle rank)
]


def make_weight(
    n: int, k: int, seed: int, magnitude: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random e4m3 codes with 128x128 block scales spread over two decades (times
    ``magnitude``)."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=gen) * 0.05
    codes, _ = quantize_weight_blocks(weight)
    scales = 10 ** (torch.rand(-(-n // BLOCK), -(-k // BLOCK), generator=gen) * 2 - 3)
    return codes, (scales * magnitude).float()


def make_x(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Activations with a few outliers, as real hidden states have."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    x[:, :: max(k // 3, 1)] *= 20
    return x.to(dtype)


def summation_bound(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, device: str
) -> torch.Tensor:
    """``2 K u (|x_q| @ |W|^T)``: the rounding room between two summation orders."""
    xq = quantize_activations(x).dequantize()
    w = dequantize_weight_blocks(weight, scales)
    unit = ACCUMULATOR_UNIT[device]
    return 2 * x.shape[1] * unit * (xq.abs() @ w.abs().T) + 1e-30


def e4m3_bound(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``(2^-4 |x| + 2^-10 s) @ |W|^T``: how far quantizing ``x`` may move the product."""
    group_scales = quantize_activations(x).scales.repeat_interleave(BLOCK, 1)[:, : x.shape[1]]
    error = E4M3_UNIT * x.float().abs() + E4M3_SUBNORMAL_HALF_STEP * group_scales
    return error @ dequantize_weight_blocks(weight, scales).abs().T


# ---- the quantize step ---------------------------------------------------------------------

# (one row of x, expected codes, expected scale per group): a 448 in a group pins its scale to 1.
QUANTIZE_CASES = [
    pytest.param([0.0] * 4, [0.0] * 4, [AMAX_FLOOR / FP8_MAX], id="zeros-floored-scale"),
    pytest.param([448.0, 1.0, -2.5, 0.0], [448.0, 1.0, -2.5, 0.0], [1.0], id="exact-codes"),
    pytest.param([896.0, 3.0, -1.0], [448.0, 1.5, -0.5], [2.0], id="scaled-by-two"),
    pytest.param([448.0, 124.33, -124.33], [448.0, 128.0, -128.0], [1.0], id="round-up-a-binade"),
    pytest.param([448.0, 17.0, 19.0, 18.5], [448.0, 16.0, 20.0, 18.0], [1.0], id="ties-to-even"),
    pytest.param([448.0, 447.0, -440.0], [448.0, 448.0, -448.0], [1.0], id="top-binade"),
    pytest.param(
        [448.0, 2.0**-9 * 1.5, 2.0**-10, 2.0**-7 * 1.0625],
        [448.0, 2.0**-8, 0.0, 2.0**-7],
        [1.0],
        id="subnormals",
    ),
    pytest.param(
        [448.0] + [1.0] * 127 + [-7.0, 3.5],
        [448.0] + [1.0] * 127 + [-448.0, 224.0],
        [1.0, 7 / 448],
        id="second-partial-group",
    ),
]


def quantize_with(implementation: str, x: torch.Tensor) -> QuantizedActivations:
    if implementation == "torch":
        return quantize_activations(x)
    from roundgate.kernels.quant.triton_fp8_gemm import quantize_activations_triton

    return quantize_activations_triton(x)


@pytest.mark.parametrize(
    "implementation", ["torch", pytest.param("triton", marks=pytest.mark.triton)]
)
@pytest.mark.parametrize(("row", "codes", "scales"), QUANTIZE_CASES)
def test_quantize_step(
    request: pytest.FixtureRequest,
    implementation: str,
    row: list[float],
    codes: list[float],
    scales: list[float],
) -> None:
    device = request.getfixturevalue("kernel_device") if implementation == "triton" else "cpu"
    quantized = quantize_with(implementation, torch.tensor([row], device=device))
    assert quantized.values.dtype == FP8_DTYPE
    assert quantized.values.float().cpu().tolist() == [codes]
    torch.testing.assert_close(quantized.scales.cpu(), torch.tensor([scales]), rtol=0, atol=0)


@pytest.mark.triton
def test_triton_rounding_matches_torch_on_every_code_and_tie(kernel_device: str) -> None:
    """Every finite e4m3 value, the midpoints between neighbours (ties) and values just off
    them, both signs: the kernel's codes are torch's (which rounds to nearest, ties to even)."""
    values = torch.arange(0, 127, dtype=torch.uint8).view(FP8_DTYPE).float()  # 0 .. 448
    mids = (values[1:] + values[:-1]) / 2
    probes = torch.cat([values, mids, mids * (1 + 2**-20), mids * (1 - 2**-20)])
    probes = torch.cat([probes, -probes])
    group = BLOCK - 1  # each group's first entry is 448, pinning its scale to exactly 1
    padded = torch.cat([probes, probes.new_zeros(-len(probes) % group)]).view(-1, group)
    rows = torch.cat([torch.full((len(padded), 1), FP8_MAX), padded], 1).view(1, -1)
    from roundgate.kernels.quant.triton_fp8_gemm import quantize_activations_triton

    kernel = quantize_activations_triton(rows.to(kernel_device))
    reference = quantize_activations(rows)
    assert torch.equal(reference.scales, torch.ones_like(reference.scales))
    assert torch.equal(kernel.values.cpu().view(torch.uint8), reference.values.view(torch.uint8))
    assert torch.equal(reference.values.float(), rows.to(FP8_DTYPE).float())  # torch's own cast


# ---- the GEMM ------------------------------------------------------------------------------


@pytest.mark.triton
@pytest.mark.parametrize(("rows", "n", "k", "dtype"), GEMM_CASES)
def test_fp8_gemm_within_bounds(
    kernel_device: str, rows: int, n: int, k: int, dtype: torch.dtype
) -> None:
    from roundgate.kernels.quant.triton_fp8_gemm import fp8_block_gemm

    weight, scales = make_weight(n, k, seed=n + k)
    x = make_x(rows, k, dtype, seed=rows)
    to = kernel_device
    y = fp8_block_gemm(x.to(to), weight.to(to), scales.to(to), out_dtype=torch.float32).cpu()
    assert y.shape == (rows, n)
    same_quantization = (y - fp8_gemm_reference(x, weight, scales)).abs()
    slack = summation_bound(x, weight, scales, kernel_device)
    assert (same_quantization <= slack).all()
    unquantized = (y - dequantized_linear(x, weight, scales)).abs()
    assert (unquantized <= e4m3_bound(x, weight, scales) + slack).all()


@pytest.mark.triton
def test_fp8_gemm_keeps_leading_dims_and_dtype(kernel_device: str) -> None:
    from roundgate.kernels.quant.triton_fp8_gemm import fp8_block_gemm

    weight, scales = make_weight(96, 160, seed=1)
    x = make_x(6, 160, torch.bfloat16, seed=2).view(2, 3, 160)
    y = fp8_block_gemm(x.to(kernel_device), weight.to(kernel_device), scales.to(kernel_device))
    assert y.shape == (2, 3, 96) and y.dtype == torch.bfloat16
    rows = x.view(6, 160)
    error = (y.cpu().float().view(6, 96) - fp8_gemm_reference(rows, weight, scales)).abs()
    # One bf16 step of the result (the interpreter truncates to bf16; a GPU rounds to nearest).
    bf16_step = 2.0**-7 * fp8_gemm_reference(rows, weight, scales).abs()
    slack = (1 + 2.0**-7) * summation_bound(rows, weight, scales, kernel_device)
    assert (error <= bf16_step + slack).all()


@pytest.mark.parametrize(
    ("weight", "scales", "x", "message"),
    [
        (torch.zeros(4, 8), torch.ones(1, 1), torch.zeros(1, 8), "float8_e4m3fn"),
        (torch.zeros(200, 8).to(FP8_DTYPE), torch.ones(1, 1), torch.zeros(1, 8), r"\[2, 1\]"),
        (torch.zeros(4, 8).to(FP8_DTYPE), torch.ones(1, 1).double(), torch.zeros(1, 8), "float32"),
        (torch.zeros(4, 8).to(FP8_DTYPE), torch.ones(1, 1), torch.zeros(1, 9), "9 columns"),
    ],
)
def test_fp8_gemm_refuses_bad_operands(weight, scales, x, message: str) -> None:
    pytest.importorskip("triton")
    from roundgate.kernels.quant.triton_fp8_gemm import fp8_block_gemm

    with pytest.raises(ValueError, match=message):
        fp8_block_gemm(x, weight, scales)


def test_quantize_refuses_integer_activations() -> None:
    with pytest.raises(ValueError, match="bf16/fp16/fp32"):
        quantize_activations(torch.zeros(2, 4, dtype=torch.int32))


def test_weight_quantization_round_trips_within_e4m3() -> None:
    weight = make_x(130, 260, torch.float32, seed=3)
    codes, scales = quantize_weight_blocks(weight)
    assert codes.shape == (130, 260) and scales.shape == (2, 3)
    error = (dequantize_weight_blocks(codes, scales) - weight).abs()
    spread = scales.repeat_interleave(BLOCK, 0)[:130].repeat_interleave(BLOCK, 1)[:, :260]
    assert (error <= E4M3_UNIT * weight.abs() + E4M3_SUBNORMAL_HALF_STEP * spread).all()


# ---- the experts ---------------------------------------------------------------------------

SILU_SLOPE = 1.1  # the largest |silu'(z)|: 1.0998, near z = 2.4
SILU_ROUNDING = 2.0**-18  # sigmoid, two products and a store in float32: a few dozen ulps

# (hidden H, intermediate I, rows per local expert)
EXPERT_CASES = [
    (200, 72, [5, 0, 18]),  # H and I off multiples of 128; an expert without rows; two tiles
    (128, 256, [1, 1]),  # a decode: one row an expert, I over two scale blocks
    (64, 32, [0, 0]),  # no rows at all (an idle rank)
]


def make_experts(
    num_experts: int, hidden: int, inter: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(w13, w13_scale_inv, w2, w2_scale_inv)``: gate, up and down each drawn as
    ``make_weight`` draws a weight (block scales spread over two decades, so that a scale read
    from the wrong block, projection or expert is far off), gate and up stacked as the
    checkpoint's two projections are."""
    shapes = {"gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}
    drawn = [
        {
            name: make_weight(*shape, seed=seed * 100 + 3 * expert + i, magnitude=0.01)
            for i, (name, shape) in enumerate(shapes.items())
        }
        for expert in range(num_experts)
    ]
    w13 = torch.stack([torch.cat([d["gate"][0], d["up"][0]]) for d in drawn])
    w13_scales = torch.stack([torch.cat([d["gate"][1], d["up"][1]]) for d in drawn])
    w2 = torch.stack([d["down"][0] for d in drawn])
    w2_scales = torch.stack([d["down"][1] for d in drawn])
    return w13, w13_scales, w2, w2_scales


def exact_fp8_activations(rows: int, width: int, seed: int) -> torch.Tensor:
    """float32 activations the quantize step represents exactly: every 128-wide group is e4m3
    codes (one of them 448) times a power of two, so its scale is that power of two."""
    gen = torch.Generator().manual_seed(seed)
    codes = (torch.randn(rows, width, generator=gen) * 100).clamp(-FP8_MAX, FP8_MAX)
    codes = codes.to(FP8_DTYPE).float()
    codes[:, ::BLOCK] = FP8_MAX
    powers = torch.randint(-12, 0, (rows, -(-width // BLOCK)), generator=gen).float().exp2()
    return codes * powers.repeat_interleave(BLOCK, 1)[:, :width]


def per_expert(counts: list[int]) -> list[tuple[int, slice]]:
    """``(expert, its rows)`` of each expert with rows."""
    return [(e, slice(sum(counts[:e]), sum(counts[: e + 1]))) for e, c in enumerate(counts) if c]


@pytest.mark.triton
@pytest.mark.parametrize(("hidden", "inter", "counts"), EXPERT_CASES)
def test_fp8_gate_up_within_summation_bounds(
    kernel_device: str, hidden: int, inter: int, counts: list[int]
) -> None:
    """Against SwiGLU over the quantized rows and the dequantized weights: summation order and
    float32 SwiGLU apart, equal."""
    from roundgate.kernels.quant.triton_fp8_experts import (
        RowTiles,
        dequantize_experts,
        fp8_gate_up,
    )

    w13, w13_scales, _, _ = weights = make_experts(len(counts), hidden, inter, seed=hidden)
    x = make_x(sum(counts), hidden, torch.float32, seed=inter)
    to = kernel_device
    tiles = RowTiles.of(counts, to)
    act = fp8_gate_up(x.to(to), tiles, w13.to(to), w13_scales.to(to)).cpu().double()
    gate_up = dequantize_experts(*weights)[0].double()
    xq = quantize_activations(x).dequantize().double()
    unit = ACCUMULATOR_UNIT[to]
    for expert, rows in per_expert(counts):
        gate_w, up_w = gate_up[expert, :inter], gate_up[expert, inter:]
        gate, up = xq[rows] @ gate_w.T, xq[rows] @ up_w.T
        gate_room = 2 * hidden * unit * (xq[rows].abs() @ gate_w.abs().T)
        up_room = 2 * hidden * unit * (xq[rows].abs() @ up_w.abs().T)
        silu_gate = torch.nn.functional.silu(gate)
        bound = (silu_gate.abs() + SILU_SLOPE * gate_room) * up_room
        bound += SILU_SLOPE * gate_room * up.abs() + SILU_ROUNDING * (silu_gate * up).abs()
        assert ((act[rows] - silu_gate * up).abs() <= bound + 1e-30).all()


@pytest.mark.triton
@pytest.mark.parametrize(("hidden", "inter", "counts"), EXPERT_CASES)
def test_fp8_down_within_summation_bounds(
    kernel_device: str, hidden: int, inter: int, counts: list[int]
) -> None:
    """On activations the quantize step keeps exactly, against the exact product with the
    dequantized weights: summation order apart, equal."""
    from roundgate.kernels.quant.triton_fp8_experts import RowTiles, dequantize_experts, fp8_down

    _, _, w2, w2_scales = weights = make_experts(len(counts), hidden, inter, seed=inter)
    act = exact_fp8_activations(sum(counts), inter, seed=hidden)
    to = kernel_device
    out = fp8_down(act.to(to), RowTiles.of(counts, to), w2.to(to), w2_scales.to(to))
    down = dequantize_experts(*weights)[1].double()
    unit = ACCUMULATOR_UNIT[to]
    for expert, rows in per_expert(counts):
        exact = act[rows].double() @ down[expert].T
        room = 2 * inter * unit * (act[rows].double().abs() @ down[expert].abs().T)
        error = (out.cpu()[rows].double() - exact).abs()
        assert (error <= room + 2 * UNIT * exact.abs() + 1e-30).all()


def experts_bound(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, device: str
) -> torch.Tensor:
    """How far one expert's FP8 output (``x`` float32, quantized on the way in and again
    between the projections) may sit from the exact product with the dequantized weights
    ``w13``/``w2``, elementwise: each error carried through SwiGLU and the down projection,
    with the accumulators' rounding. A worst case, loose by about the square root of the
    widths: the tests above are the tight ones."""
    x, w13, w2 = x.double(), w13.double(), w2.double()
    inter, unit = w2.shape[1], ACCUMULATOR_UNIT[device]
    gate_w, up_w = w13[:inter], w13[inter:]
    x_scales = quantize_activations(x.float()).scales.double()
    x_error = E4M3_UNIT * x.abs() + E4M3_SUBNORMAL_HALF_STEP * _spread(x_scales, x.shape[1])
    x_high = x.abs() + x_error

    def linear_error(w: torch.Tensor) -> torch.Tensor:
        return x_error @ w.abs().T + 2 * x.shape[1] * unit * (x_high @ w.abs().T)

    gate, up = x @ gate_w.T, x @ up_w.T
    gate_error, up_error = linear_error(gate_w), linear_error(up_w)
    silu_gate = torch.nn.functional.silu(gate)
    act_error = (silu_gate.abs() + SILU_SLOPE * gate_error) * up_error
    act_error += up.abs() * SILU_SLOPE * gate_error
    act_high = (silu_gate * up).abs() + act_error
    act_error += SILU_ROUNDING * act_high
    groups = torch.nn.functional.pad(act_high, (0, -inter % BLOCK))
    groups = groups.view(len(x), -(-inter // BLOCK), BLOCK)
    act_scales = groups.amax(-1).clamp_min(AMAX_FLOOR) / FP8_MAX  # above the kernel's scales
    act_error += E4M3_UNIT * act_high + E4M3_SUBNORMAL_HALF_STEP * _spread(act_scales, inter)
    down_error = act_error @ w2.abs().T + 2 * inter * unit * ((act_high + act_error) @ w2.abs().T)
    return down_error + 2 * UNIT * ((silu_gate * up) @ w2.T).abs() + 1e-30


def _spread(scales: torch.Tensor, width: int) -> torch.Tensor:
    return scales.repeat_interleave(BLOCK, 1)[:, :width]


@pytest.mark.triton
@pytest.mark.parametrize(("hidden", "inter", "counts"), EXPERT_CASES[:2])
def test_fp8_experts_within_bounds(
    kernel_device: str, hidden: int, inter: int, counts: list[int]
) -> None:
    """The whole op against ``run_experts``' arithmetic on the dequantized weights."""
    from roundgate.kernels.quant.triton_fp8_experts import dequantize_experts, fp8_run_experts

    weights = make_experts(len(counts), hidden, inter, seed=hidden + inter)
    x = make_x(sum(counts), hidden, torch.float32, seed=len(counts))
    to = kernel_device
    y = fp8_run_experts(x.to(to), counts, *(w.to(to) for w in weights)).cpu()
    w13, w2 = dequantize_experts(*weights)
    for expert, rows in per_expert(counts):
        gate_w, up_w = w13[expert, :inter].double(), w13[expert, inter:].double()
        act = torch.nn.functional.silu(x[rows].double() @ gate_w.T) * (x[rows].double() @ up_w.T)
        error = (y[rows].double() - act @ w2[expert].double().T).abs()
        assert (error <= experts_bound(x[rows], w13[expert], w2[expert], to)).all()


def test_fp8_experts_refuse_mismatched_weights() -> None:
    pytest.importorskip("triton")
    from roundgate.kernels.quant.triton_fp8_experts import fp8_run_experts

    w13, s13, w2, s2 = make_experts(2, 64, 32, seed=0)
    with pytest.raises(ValueError, match="w13_scale_inv"):
        fp8_run_experts(torch.zeros(1, 64), [1, 0], w13, s13[:, :1], w2, s2)
    with pytest.raises(ValueError, match="w13 "):
        fp8_run_experts(torch.zeros(1, 64), [1, 0], w13[:, :10], s13, w2, s2)
    with pytest.raises(ValueError, match="counts"):
        fp8_run_experts(torch.zeros(2, 64), [1, 0], w13, s13, w2, s2)


# ---- Fp8Linear -----------------------------------------------------------------------------


def test_fp8_linear_on_cpu_is_the_dequantized_product() -> None:
    weight, scales = make_weight(64, 200, seed=4)
    layer = Fp8Linear(weight, scales)
    x = make_x(4, 200, torch.bfloat16, seed=5).view(2, 2, 200)
    y = layer(x)
    assert y.shape == (2, 2, 64) and y.dtype == torch.bfloat16
    assert torch.equal(y, dequantized_linear(x, weight, scales).to(torch.bfloat16))
    assert set(layer.state_dict()) == {"weight", "weight_scale_inv"}
    assert layer.nbytes == 64 * 200 + 4 * 2


@pytest.mark.triton
def test_fp8_linear_runs_the_kernel_when_asked(kernel_device: str) -> None:
    weight, scales = make_weight(64, 200, seed=6)
    layer = Fp8Linear(weight, scales, use_kernel=True).to(kernel_device)
    x = make_x(3, 200, torch.float32, seed=7)
    y = layer(x.to(kernel_device)).cpu()
    slack = summation_bound(x, weight, scales, kernel_device)
    assert ((y - fp8_gemm_reference(x, weight, scales)).abs() <= slack).all()


def test_fp8_linear_refuses_a_wrong_width() -> None:
    weight, scales = make_weight(8, 16, seed=8)
    with pytest.raises(ValueError, match="expected 16"):
        Fp8Linear(weight, scales)(torch.zeros(1, 15))


# ---- DeepSeek-V3's weights per rank --------------------------------------------------------

# By hand (DeepSeek-V3, 8 ranks, 32 of each MoE layer's 256 routed experts per rank):
# one expert: 3 x 2048 x 7168 = 44,040,192 weights, 3 x 16 x 56 = 2,688 blocks;
# MLA per layer: 1536x7168 + 24576x1536 + 576x7168 + 32768x512 + 7168x16384 = 187,105,280
# weights in 672 + 2,304 + 280 + 1,024 + 7,168 = 11,448 blocks;
# dense MLP: 3 x 18432 x 7168 = 396,361,728 weights in 3 x 144 x 56 = 24,192 blocks.
ROUTED = 58 * 32 * 44_040_192
REPLICATED = 61 * 187_105_280 + 3 * 396_361_728 + 58 * 44_040_192
BLOCKS = 58 * 32 * 2_688 + 61 * 11_448 + 3 * 24_192 + 58 * 2_688
UNQUANTIZED = (
    2 * (2 * 129_280 * 7_168 + 61 * (2 * 7_168 + 1_536 + 512) + 7_168 + 58 * 256 * 7_168)
    + 4 * 58 * 256
)


@pytest.mark.parametrize(
    ("fp8", "routed", "replicated", "scales"),
    [(True, ROUTED, REPLICATED, 4 * BLOCKS), (False, 2 * ROUTED, 2 * REPLICATED, 0)],
)
def test_deepseek_v3_weight_bytes_per_rank(
    fp8: bool, routed: int, replicated: int, scales: int
) -> None:
    held = weight_bytes_per_rank(MoEShape(), num_ranks=8, fp8=fp8)
    assert (held.routed_experts, held.replicated_linears) == (routed, replicated)
    assert (held.scales, held.unquantized) == (scales, UNQUANTIZED)
    assert held.total == routed + replicated + scales + UNQUANTIZED


def test_deepseek_v3_has_671b_parameters() -> None:
    """One rank holding every expert in bf16: two bytes a parameter (bar the float32 bias)."""
    whole = weight_bytes_per_rank(MoEShape(), num_ranks=1, fp8=False)
    params = (whole.total - 4 * 58 * 256) // 2 + 58 * 256
    assert 671.0e9 < params < 671.1e9


def test_experts_must_split_evenly_over_the_ranks() -> None:
    with pytest.raises(ValueError, match="num_ranks: 3"):
        weight_bytes_per_rank(MoEShape(), num_ranks=3, fp8=True)


@pytest.mark.triton
def test_masked_fp8_experts_equal_the_grouped_ones(kernel_device: str) -> None:
    """DeepEP's low-latency layout (``[E, M, H]``, counts on the device) through the FP8
    experts gives each valid row what the grouped rows give it (the same kernels, tiles
    built on the device; tiles past an expert's count empty)."""
    from roundgate.kernels.quant.triton_fp8_experts import fp8_run_experts, masked_fp8_experts

    hidden, inter, counts, rows = 128, 256, [3, 0, 17], 20
    weights = [w.to(kernel_device) for w in make_experts(len(counts), hidden, inter, seed=7)]
    x = make_x(sum(counts), hidden, torch.float32, seed=3).to(kernel_device)
    grouped = fp8_run_experts(x, counts, *weights)
    packed = torch.full((len(counts), rows, hidden), float("nan"), device=kernel_device)
    for expert, part in per_expert(counts):
        packed[expert, : counts[expert]] = x[part]
    device_counts = torch.tensor(counts, dtype=torch.int32, device=kernel_device)
    out = masked_fp8_experts(packed, device_counts, *weights)
    assert out.shape == packed.shape
    for expert, part in per_expert(counts):
        torch.testing.assert_close(out[expert, : counts[expert]], grouped[part], rtol=0, atol=0)
