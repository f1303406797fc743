"""Every Triton kernel of the project compiled for an H100 (sm_90) on this machine, with what
each one takes of the chip: shared memory, registers, spills.

No GPU is needed: Triton compiles for a named target (``GPUTarget("cuda", 90, 32)``) down to
PTX, and the ``ptxas`` its wheel ships assembles that to the cubin. The kernels are compiled as
a launch would compile them: the arguments are meta tensors of the serving shapes (no memory
behind them) passed through Triton's own argument binder, which specializes them as a launch
does (16-byte aligned pointers, strides divisible by 16, integers equal to 1); the block sizes
are the launchers' own constants. Shared memory is Triton's (``metadata.shared``, the dynamic
shared memory a launch requests); registers and spills come from ``ptxas -v`` run on the PTX
with Triton's flags (Triton reads registers only from a loaded module, which needs a driver).

The shapes are the serving ones: GQA at Llama-3-8B's (32 query heads, 8 KV heads, head dim
128), MLA at DeepSeek-V3's (kv_lora_rank 512, RoPE 64, 128 heads), the fused MoE at
DeepSeek-V3's experts (hidden 7168, moe_intermediate 2048; 256 experts over 8 ranks, top-8),
the block-FP8 GEMM at N=18432, K=7168 for each of its tile configurations, and the FP8 experts
at DeepSeek-V3's expert shapes.

Usage: ``python -m roundgate.kernels.sm90_report [--json]`` (with ``TRITON_INTERPRET`` unset:
interpreted kernels cannot be compiled). It exits 1 when a kernel exceeds an H100's limits.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from roundgate.kernels.kernel_case import KernelCase, meta_tensor
from roundgate.kernels.sm90_fused_cases import fused_cases
from roundgate.kernels.triton_env import INTERPRET_ENV, interpreter_enabled, tile_width

CAPABILITY = 90
# What one H100 SXM block and SM may use (CUDA's occupancy limits for compute capability 9.0).
MAX_SHARED_BYTES = 227 * 1024  # dynamic shared memory per block, opted in
MAX_REGS_PER_THREAD = 255
REGS_PER_SM = 64 * 1024
REG_ALLOCATION_UNIT = 8  # registers are granted per thread in multiples of 8 (256 per warp)


@dataclass(frozen=True)
class KernelResources:
    """What one compiled kernel takes of an sm_90 SM."""

    name: str
    shape: str
    num_warps: int
    num_stages: int
    shared_bytes: int
    registers: int  # per thread
    spill_store_bytes: int
    spill_load_bytes: int
    tensor_cores: str  # "wgmma" (sm_90's warpgroup MMA), "mma" (warp MMA) or "none"

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    @property
    def block_registers(self) -> int:
        """Registers one block holds: per thread (in allocation units) times its threads."""
        per_thread = -(-self.registers // REG_ALLOCATION_UNIT) * REG_ALLOCATION_UNIT
        return per_thread * self.threads

    def violations(self) -> list[str]:
        """The H100 limits this kernel exceeds (empty: it launches)."""
        found = []
        if self.shared_bytes > MAX_SHARED_BYTES:
            found.append(f"shared memory {self.shared_bytes} B > {MAX_SHARED_BYTES} B")
        if self.registers > MAX_REGS_PER_THREAD:
            found.append(f"{self.registers} registers per thread > {MAX_REGS_PER_THREAD}")
        if self.block_registers > REGS_PER_SM:
            found.append(f"{self.block_registers} registers per block > {REGS_PER_SM}")
        return found


def attention_cases() -> list[KernelCase]:
    """GQA decode and extend at Llama-3-8B's heads, MLA at DeepSeek-V3's latent."""
    from roundgate.kernels.attention import triton_decode, triton_extend, triton_mla

    batch, tokens, max_pages, dim, heads, kv_heads = 64, 2048, 256, 128, 32, 8
    page_table = meta_tensor(batch, max_pages, dtype=torch.long)
    lens = meta_tensor(batch + 1, dtype=torch.long)  # kv lengths, or cumulative query lengths
    slots = 4096 * 16  # 4096 pages of 16 tokens
    kv = meta_tensor(slots, kv_heads, dim)
    q_decode, q_extend = meta_tensor(batch, heads, dim), meta_tensor(tokens, heads, dim)
    gqa = dict(PAGE_SIZE=16, GROUP=heads // kv_heads, HEAD_DIM=dim, BLOCK_D=tile_width(dim))
    decode = KernelCase(
        "gqa_decode",
        f"{heads} heads / {kv_heads} KV, dim {dim}, page 16",
        triton_decode._paged_decode_kernel,
        (
            q_decode,
            kv,
            kv,
            q_decode,
            page_table,
            lens,
            0.088,
            *q_decode.stride()[:2],
            *kv.stride()[:2],
            *q_decode.stride()[:2],
            page_table.stride(0),
        ),
        {**gqa, "BLOCK_N": triton_decode.BLOCK_N},
    )
    extend = KernelCase(
        "gqa_extend",
        f"{heads} heads / {kv_heads} KV, dim {dim}, page 16",
        triton_extend._paged_extend_kernel,
        (
            q_extend,
            kv,
            kv,
            q_extend,
            page_table,
            lens,
            lens,
            0.088,
            *q_extend.stride()[:2],
            *kv.stride()[:2],
            *q_extend.stride()[:2],
            page_table.stride(0),
        ),
        {**gqa, "BLOCK_M": triton_extend.BLOCK_M, "BLOCK_N": triton_extend.BLOCK_N},
    )
    mla_heads, rank, rope = 128, 512, 64
    q_lat, q_pe = meta_tensor(tokens, mla_heads, rank), meta_tensor(tokens, mla_heads, rope)
    cache = meta_tensor(4096 * 64, rank + rope)  # 4096 pages of 64 tokens
    mla = KernelCase(
        "mla_absorbed",
        f"{mla_heads} heads, kv_lora_rank {rank}, rope {rope}, page 64",
        triton_mla._mla_absorbed_kernel,
        (
            q_lat,
            q_pe,
            cache,
            q_lat,
            page_table,
            lens,
            lens,
            0.072,
            *q_lat.stride()[:2],
            *q_pe.stride()[:2],
            cache.stride(0),
            *q_lat.stride()[:2],
            page_table.stride(0),
        ),
        dict(
            PAGE_SIZE=64,
            HEADS=mla_heads,
            RANK=rank,
            ROPE=rope,
            BLOCK_R=tile_width(rank),
            BLOCK_P=tile_width(rope),
            BLOCK_M=triton_mla.BLOCK_M,
            BLOCK_N=triton_mla.BLOCK_N,
        ),
    )
    return [decode, extend, mla]


def moe_cases() -> list[KernelCase]:
    """The fused MoE's two kernels at DeepSeek-V3's experts, 32 local experts (256 over 8)."""
    from roundgate.kernels.moe import triton_experts as moe

    hidden, inter, local_experts, rows = 7168, 2048, 32, 4096
    x, act, out = meta_tensor(rows, hidden), meta_tensor(rows, inter), meta_tensor(rows, hidden)
    w13, w2 = (
        meta_tensor(local_experts, 2 * inter, hidden),
        meta_tensor(local_experts, hidden, inter),
    )
    tiles = meta_tensor(rows // moe.BLOCK_M + local_experts, dtype=torch.long)
    blocks = dict(BLOCK_M=moe.BLOCK_M, BLOCK_N=moe.BLOCK_N, BLOCK_K=moe.BLOCK_K)
    shape = f"hidden {hidden}, moe_intermediate {inter}, {local_experts} of 256 experts"
    return [
        KernelCase(
            "moe_gate_up_silu",
            shape,
            moe._gate_up_silu_kernel,
            (
                x,
                w13,
                act,
                tiles,
                tiles,
                tiles,
                hidden,
                inter,
                x.stride(0),
                *w13.stride()[:2],
                act.stride(0),
            ),
            blocks,
        ),
        KernelCase(
            "moe_down",
            shape,
            moe._down_kernel,
            (
                act,
                w2,
                out,
                tiles,
                tiles,
                tiles,
                hidden,
                inter,
                act.stride(0),
                *w2.stride()[:2],
                out.stride(0),
            ),
            blocks,
        ),
    ]


def fp8_cases() -> list[KernelCase]:
    """The block-FP8 GEMM's quantize step and each of its tile configurations."""
    from roundgate.kernels.quant import fp8_blocks as fp8
    from roundgate.kernels.quant import triton_fp8_gemm as gemm

    n, k, rows = 18432, 7168, 4096
    x, codes = meta_tensor(rows, k), meta_tensor(rows, k, dtype=fp8.FP8_DTYPE)
    x_scales = meta_tensor(rows, fp8.num_blocks(k), dtype=torch.float32)
    weight = meta_tensor(n, k, dtype=fp8.FP8_DTYPE)
    w_scales = meta_tensor(fp8.num_blocks(n), fp8.num_blocks(k), dtype=torch.float32)
    y = meta_tensor(rows, n)
    cases = [
        KernelCase(
            "fp8_quantize",
            f"K {k}, 1x128 groups",
            gemm._quantize_groups_kernel,
            (x, codes, x_scales, k, x.stride(0), codes.stride(0), x_scales.stride(0)),
            dict(AMAX_FLOOR=fp8.AMAX_FLOOR, FP8_MAX=fp8.FP8_MAX, GROUP=fp8.BLOCK),
        )
    ]
    for label, tiles in (
        ("decode", gemm.DECODE_TILES),
        ("small", gemm.SMALL_TILES),
        ("prefill", gemm.PREFILL_TILES),
    ):
        cases.append(
            KernelCase(
                f"fp8_gemm_{label}",
                f"N {n}, K {k}, tile {tiles.block_m}x{tiles.block_n}x{fp8.BLOCK}",
                gemm._fp8_block_gemm_kernel,
                (
                    codes,
                    x_scales,
                    weight,
                    w_scales,
                    y,
                    rows,
                    n,
                    k,
                    codes.stride(0),
                    x_scales.stride(0),
                    weight.stride(0),
                    w_scales.stride(0),
                    y.stride(0),
                ),
                dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=fp8.BLOCK),
                num_warps=tiles.num_warps,
                num_stages=tiles.num_stages,
            )
        )
    return cases


def fp8_moe_cases() -> list[KernelCase]:
    """The FP8 experts' two kernels at DeepSeek-V3's experts, 32 local experts (256 over 8)."""
    from roundgate.kernels.quant import fp8_blocks as fp8
    from roundgate.kernels.quant import triton_fp8_experts as moe

    hidden, inter, local_experts, rows = 7168, 2048, 32, 4096
    x, act, out = meta_tensor(rows, hidden), meta_tensor(rows, inter), meta_tensor(rows, hidden)
    w13 = meta_tensor(local_experts, 2 * inter, hidden, dtype=fp8.FP8_DTYPE)
    w2 = meta_tensor(local_experts, hidden, inter, dtype=fp8.FP8_DTYPE)
    blocks_h, blocks_i = fp8.num_blocks(hidden), fp8.num_blocks(inter)
    s13 = meta_tensor(local_experts, 2 * blocks_i, blocks_h, dtype=torch.float32)
    s2 = meta_tensor(local_experts, blocks_h, blocks_i, dtype=torch.float32)
    tiles = meta_tensor(rows // moe.BLOCK_M + local_experts, dtype=torch.long)
    constants = dict(
        AMAX_FLOOR=fp8.AMAX_FLOOR,
        FP8_MAX=fp8.FP8_MAX,
        BLOCK_M=moe.BLOCK_M,
        BLOCK_N=moe.BLOCK_N,
        BLOCK_K=fp8.BLOCK,
    )
    shape = f"hidden {hidden}, moe_intermediate {inter}, {local_experts} of 256 experts, FP8"
    return [
        KernelCase(
            "fp8_moe_gate_up",
            shape,
            moe._fp8_gate_up_silu_kernel,
            (
                x,
                w13,
                s13,
                act,
                tiles,
                tiles,
                tiles,
                hidden,
                inter,
                blocks_i,
                x.stride(0),
                *w13.stride()[:2],
                *s13.stride()[:2],
                act.stride(0),
            ),
            constants,
        ),
        KernelCase(
            "fp8_moe_down",
            shape,
            moe._fp8_down_kernel,
            (
                act,
                w2,
                s2,
                out,
                tiles,
                tiles,
                tiles,
                hidden,
                inter,
                act.stride(0),
                *w2.stride()[:2],
                *s2.stride()[:2],
                out.stride(0),
            ),
            constants,
        ),
    ]


CASE_GROUPS: tuple[Callable[[], list[KernelCase]], ...] = (
    attention_cases,
    moe_cases,
    fp8_cases,
    fp8_moe_cases,
    fused_cases,
)


def compile_case(case: KernelCase) -> KernelResources:
    """Compile ``case`` for sm_90 and read what it takes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    if interpreter_enabled():
        raise RuntimeError(f"{INTERPRET_ENV} is set: interpreted kernels cannot be compiled")
    target = GPUTarget("cuda", CAPABILITY, 32)
    backend = make_backend(target)
    kernel = case.kernel
    # Triton's own launch path (pinned triton==3.9.0): bind and specialize the arguments,
    # then pack them into the signature, constants and attributes its compiler takes.
    launch = dict(case.constexprs, num_warps=case.num_warps, num_stages=case.num_stages)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*case.args, **launch)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, launch, bound, specialization, options
    )
    source = ASTSource(kernel, signature, constexprs, attrs)
    compiled = triton.compile(source, target=target, options=options.__dict__)
    registers, spill_stores, spill_loads = ptxas_usage(compiled.asm["ptx"])
    return KernelResources(
        name=case.name,
        shape=case.shape,
        num_warps=compiled.metadata.num_warps,
        num_stages=compiled.metadata.num_stages,
        shared_bytes=compiled.metadata.shared,
        registers=registers,
        spill_store_bytes=spill_stores,
        spill_load_bytes=spill_loads,
        tensor_cores=tensor_core_kind(compiled.asm["ptx"]),
    )


def tensor_core_kind(ptx: str) -> str:
    """Which matrix instructions ``ptx`` issues: sm_90's asynchronous warpgroup MMA, the warp
    MMA of earlier GPUs (Triton's fallback for tiles wgmma cannot take), or none."""
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    return "mma" if re.search(r"\bmma\.sync", ptx) else "none"


def ptxas_usage(ptx: str) -> tuple[int, int, int]:
    """(registers per thread, spill store bytes, spill load bytes) from ``ptxas -v`` on
    ``ptx``, assembled for sm_90a with the flags Triton passes."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run(
            [
                get_ptxas(CAPABILITY).path,
                "-v",
                "-lineinfo",
                "--regAllocOptLevel=2",
                f"--gpu-name={sm_arch_from_capability(CAPABILITY)}",
                str(source),
                "-o",
                str(source.with_suffix(".cubin")),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    return parse_ptxas_log(done.stdout + done.stderr)


def parse_ptxas_log(log: str) -> tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) of the one kernel ``log`` reports.

    Example: ``"0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads ... Used 40
    registers"`` -> ``(40, 8, 4)``.
    """
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if registers is None or spills is None:
        raise ValueError(f"ptxas log without register or spill counts:\n{log}")
    return int(registers.group(1)), int(spills.group(1)), int(spills.group(2))


def compile_all() -> list[KernelResources]:
    """Every kernel of the project at its serving shapes, compiled for sm_90."""
    return [compile_case(case) for group in CASE_GROUPS for case in group()]


def format_table(resources: Sequence[KernelResources]) -> str:
    """One line a kernel: its shape, launch options and what it takes against H100 limits."""
    head = (
        f"{'kernel':<18} {'warps':>5} {'stages':>6} {'shared KiB':>10} {'regs':>4} "
        f"{'spills st/ld B':>14} {'regs/block':>10} {'MMA':>5}  fits H100  shape"
    )
    lines = [head, "-" * len(head)]
    for r in resources:
        fits = "yes" if not r.violations() else "NO: " + "; ".join(r.violations())
        lines.append(
            f"{r.name:<18} {r.num_warps:>5} {r.num_stages:>6} {r.shared_bytes / 1024:>10.1f} "
            f"{r.registers:>4} {f'{r.spill_store_bytes}/{r.spill_load_bytes}':>14} "
            f"{r.block_registers:>10} {r.tensor_cores:>5}  {fits:<9} {r.shape}"
        )
    limits = (
        f"H100 limits: {MAX_SHARED_BYTES // 1024} KiB shared memory per block, "
        f"{MAX_REGS_PER_THREAD} registers per thread, {REGS_PER_SM} registers per SM"
    )
    return "\n".join([*lines, limits])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m roundgate.kernels.sm90_report",
        description="Compile every Triton kernel for sm_90 and report its shared memory, "
        "registers and spills against an H100's limits.",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per kernel")
    args = parser.parse_args(argv)
    resources = compile_all()
    if args.json:
        print(json.dumps([asdict(r) for r in resources], indent=1))
    else:
        print(format_table(resources))
    return 1 if any(r.violations() for r in resources) else 0


if __name__ == "__main__":
    sys.exit(main())
