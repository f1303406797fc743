"""The fused decode path's kernels at DeepSeek-V3's serving shapes, for the sm_90 report.

Each case is what the launcher in its module passes at 64 decode tokens (the router, norms,
activation and MLA preamble: one program per token or row) and at 4096 tokens of 8 experts
each for the device-built expert layout and the fused experts (a prefill-sized round, the
largest grid those kernels see); widths: hidden 7168, q-LoRA 1536, kv_lora_rank 512, RoPE
64, 128 heads, 256 experts in 8 groups (4 kept, top 8), moe_intermediate 2048.
"""

from __future__ import annotations

import torch
import triton

from roundgate.kernels.kernel_case import KernelCase, meta_tensor

DECODE_TOKENS, PREFILL_TOKENS = 64, 4096
HIDDEN, Q_LORA, RANK, ROPE, NOPE, HEADS = 7168, 1536, 512, 64, 128, 128
EXPERTS, GROUPS, TOPK_GROUP, TOP_K, MOE_INTER = 256, 8, 4, 8, 2048
F32, I32, I64 = torch.float32, torch.int32, torch.int64


def norm_cases() -> list[KernelCase]:
    """``rms_norm`` (hidden and q-LoRA widths) and ``add_rms_norm``, ``silu_mul``."""
    from roundgate.kernels.fused import triton_act, triton_norm

    cases = []
    for name, width, residual in (
        ("rms_norm", HIDDEN, False),
        ("add_rms_norm", HIDDEN, True),
        ("rms_norm_q_lora", Q_LORA, False),
    ):
        x = meta_tensor(DECODE_TOKENS, width)
        block = triton.next_power_of_2(width)
        cases.append(
            KernelCase(
                name,
                f"{DECODE_TOKENS} rows of {width}",
                triton_norm._rms_norm_kernel,
                (x, x, meta_tensor(width), x, x, 1e-6, width, width, width, width),
                dict(D=width, BLOCK=block, HAS_RESIDUAL=residual),
                num_warps=triton_norm._num_warps(block),
            )
        )
    gate_up, out = meta_tensor(DECODE_TOKENS, 2 * MOE_INTER), meta_tensor(DECODE_TOKENS, MOE_INTER)
    cases.append(
        KernelCase(
            "silu_mul",
            f"{DECODE_TOKENS} rows, intermediate {MOE_INTER}",
            triton_act._silu_mul_kernel,
            (gate_up, out, MOE_INTER, gate_up.stride(0), out.stride(0)),
            dict(BLOCK=triton_act.MAX_BLOCK),
        )
    )
    return cases


def mla_prep_cases() -> list[KernelCase]:
    """``mla_prep``: the latent's norm, both RoPEs and the cache row, 64-token pages."""
    from roundgate.kernels.attention import triton_mla_prep as prep

    q = meta_tensor(DECODE_TOKENS, HEADS, NOPE + ROPE)
    kv, cos = meta_tensor(DECODE_TOKENS, RANK + ROPE), meta_tensor(DECODE_TOKENS, 1, ROPE)
    cache = meta_tensor(1024, 64, 1, RANK + ROPE)
    args = (q, kv, meta_tensor(RANK), cos, cos, meta_tensor(DECODE_TOKENS, dtype=I64), cache)
    strides = (*q.stride()[:2], kv.stride(0), cos.stride(0), cos.stride(0), *cache.stride()[:2])
    constexprs = dict(
        HEADS=HEADS,
        NOPE=NOPE,
        RANK=RANK,
        HALF=ROPE // 2,
        PAGE_SIZE=64,
        BLOCK_H=prep.MAX_BLOCK_H,
        BLOCK_R=RANK,
        BLOCK_HALF=ROPE // 2,
        enable_fp_fusion=False,  # the launcher's option: torch's rounding, no FMA
    )
    shape = f"{HEADS} heads, kv_lora_rank {RANK}, rope {ROPE}"
    return [
        KernelCase("mla_prep", shape, prep._mla_prep_kernel, (*args, 1e-6, *strides), constexprs)
    ]


def moe_cases() -> list[KernelCase]:
    """The router (DeepSeek-V3's grouped ``noaux_tc``), the expert layout and fused experts."""
    from roundgate.kernels.moe import triton_fused_moe as fm
    from roundgate.kernels.moe import triton_router as router

    logits = meta_tensor(DECODE_TOKENS, EXPERTS, dtype=F32)
    per_group = EXPERTS // GROUPS
    route = KernelCase(
        "route",
        f"{EXPERTS} experts, {GROUPS} groups ({TOPK_GROUP} kept), top {TOP_K}",
        router._route_kernel,
        (
            logits,
            meta_tensor(EXPERTS, dtype=F32),
            meta_tensor(DECODE_TOKENS, TOP_K, dtype=F32),
            meta_tensor(DECODE_TOKENS, TOP_K, dtype=I64),
            EXPERTS,
            per_group,
            logits.stride(0),
            1e-20,
            2.5,
        ),
        dict(
            SIGMOID=True,
            HAS_BIAS=True,
            GROUP_SCORE=2,
            NUM_GROUPS=GROUPS,
            TOPK_GROUP=TOPK_GROUP,
            TOP_K=TOP_K,
            NORM=True,
            BLOCK_G=GROUPS,
            BLOCK_S=per_group,
            BLOCK_K=TOP_K,
        ),
    )
    pairs = PREFILL_TOKENS * TOP_K
    padded = fm.max_padded(pairs, EXPERTS, fm.BLOCK_M)
    sorted_pairs = meta_tensor(padded, dtype=I32)
    block_expert, num_padded = (
        meta_tensor(padded // fm.BLOCK_M, dtype=I32),
        meta_tensor(1, dtype=I32),
    )
    layout = (sorted_pairs, block_expert, num_padded)
    align = KernelCase(
        "align_by_expert",
        f"{pairs} pairs, {EXPERTS} experts",
        fm._align_kernel,
        (
            meta_tensor(pairs, dtype=I64),
            meta_tensor(pairs, dtype=I64),
            *layout,
            pairs,
            EXPERTS,
            padded,
            pairs.bit_length(),
        ),
        dict(BLOCK_M=fm.BLOCK_M, BLOCK_E=EXPERTS, BLOCK=fm._ALIGN_BLOCK),
    )
    x, act = meta_tensor(PREFILL_TOKENS, HIDDEN), meta_tensor(padded, MOE_INTER)
    w13, w2 = meta_tensor(EXPERTS, 2 * MOE_INTER, HIDDEN), meta_tensor(EXPERTS, HIDDEN, MOE_INTER)
    weights = meta_tensor(PREFILL_TOKENS, TOP_K, dtype=F32)
    out = meta_tensor(PREFILL_TOKENS, TOP_K, HIDDEN, dtype=F32)
    blocks = dict(BLOCK_M=fm.BLOCK_M, BLOCK_N=fm.BLOCK_N, BLOCK_K=fm.BLOCK_K)
    sizes = (pairs, TOP_K, HIDDEN, MOE_INTER)
    shape = f"{PREFILL_TOKENS} tokens x top {TOP_K}, hidden {HIDDEN}, intermediate {MOE_INTER}"
    gate_up = KernelCase(
        "fused_moe_gate_up",
        shape,
        fm._fused_gate_up_silu_kernel,
        (x, w13, act, *layout, *sizes, x.stride(0), *w13.stride()[:2], act.stride(0)),
        blocks,
    )
    down = KernelCase(
        "fused_moe_down",
        shape,
        fm._fused_down_kernel,
        (
            act,
            w2,
            out,
            weights,
            *layout,
            *sizes,
            act.stride(0),
            *w2.stride()[:2],
            *weights.stride(),
            out.stride(1),
        ),
        blocks,
    )
    return [route, align, gate_up, down]


def fused_cases() -> list[KernelCase]:
    """Every kernel of the fused decode path."""
    return [*norm_cases(), *mla_prep_cases(), *moe_cases()]
