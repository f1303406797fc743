"""Fused MoE experts for a rank that holds every expert, laid out on the device alone.

``triton_experts.py`` tiles rows grouped by a dispatch whose expert counts were read to the
host (``bincount().tolist()``), one device sync per MoE layer and no CUDA graph. Here the
layout is built on the device and every grid is sized by shapes only::

    layout = align_by_expert(ids, E, BLOCK_M)   # view, stable sort, 3 outputs, 1 launch
    act    = gate_up_silu(x, layout)            # [P_max, I]: one row per padded slot
    buf    = down(act, layout) * weight         # [T, k, H] float32: one row per (t, j) pair
    out    = buf.sum(1)                         # (cast back to x's dtype when not float32)

The layout, for pairs ``p = t * k + j`` grouped by expert, each expert's run padded to a
multiple of ``block_m`` with the sentinel ``S = T * k`` (``block_m`` 4; experts 0, 1, 2 with
3, 0 and 5 pairs)::

    sorted_pairs  p p p S | p p p p p S S S | S S ... (up to P_max)
    block_expert  0       | 2       2       | -1 ...
    num_padded    12

``P_max = round_up(T * k + E * (block_m - 1), block_m)`` bounds the padded length whatever
the ids, so the expert kernels launch ``P_max / block_m`` row blocks and the blocks past
``num_padded`` (read inside the kernel) exit at once. A token's ``k`` rows are summed by
``torch.sum`` in pair order, so the result does not depend on which block ran first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from roundgate.kernels.moe.triton_experts import down_tile, gate_up_silu_tile

BLOCK_M = 16  # rows (pairs) per block: a decode's few pairs per expert waste little
BLOCK_N = 64
BLOCK_K = 64
_ALIGN_BLOCK = 256  # pairs each step of an expert's scatter loop writes


@dataclass(frozen=True)
class ExpertLayout:
    """Pairs grouped by expert, padded to whole blocks; all device tensors, no host read."""

    sorted_pairs: torch.Tensor  # int32 [P_max]: pair t * k + j, or the sentinel T * k
    block_expert: torch.Tensor  # int32 [P_max // block_m]: each block's expert, -1 past the end
    num_padded: torch.Tensor  # int32 [1]: the used length of ``sorted_pairs``
    block_m: int  # slots per block
    num_pairs: int  # T * k: also the sentinel, one past the last pair


def max_padded(num_pairs: int, num_experts: int, block_m: int) -> int:
    """``P_max``: every expert's run rounded up to ``block_m`` fits, whatever the ids."""
    return -(-(num_pairs + num_experts * (block_m - 1)) // block_m) * block_m


@triton.jit
def _lower_bounds(sorted_ptr, num_pairs, targets, num_steps):
    """First index of ``sorted_ptr[:num_pairs]`` holding a value >= each of ``targets``."""
    lo = tl.zeros_like(targets)
    hi = tl.zeros_like(targets) + num_pairs
    for _ in range(num_steps):
        open_ = lo < hi
        mid = (lo + hi) // 2
        value = tl.load(sorted_ptr + mid, mask=open_, other=0)
        right = open_ & (value < targets)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(open_ & ~right, mid, hi)
    return lo


@triton.jit
def _align_kernel(
    sorted_ids_ptr,
    order_ptr,
    sorted_pairs_ptr,
    block_expert_ptr,
    num_padded_ptr,
    num_pairs,
    num_experts,
    max_padded,
    num_steps,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Program e < E writes expert e's run and blocks; program E the tail past the last run.
    # Each one finds every expert's run in the sorted ids (a binary search per expert) to
    # place its own: E * log(T * k) loads, no scratch memory, no second launch.
    program = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    starts = _lower_bounds(sorted_ids_ptr, num_pairs, experts.to(tl.int64), num_steps)
    ends = _lower_bounds(sorted_ids_ptr, num_pairs, experts.to(tl.int64) + 1, num_steps)
    counts = tl.where(experts < num_experts, ends - starts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    offsets = tl.cumsum(padded, 0) - padded
    lane = tl.arange(0, BLOCK)
    sentinel = num_pairs
    if program < num_experts:
        mine = experts == program
        start = tl.sum(tl.where(mine, starts, 0))
        count = tl.sum(tl.where(mine, counts, 0))
        size = tl.sum(tl.where(mine, padded, 0))
        offset = tl.sum(tl.where(mine, offsets, 0))
        for r in range(0, size, BLOCK):
            slot = r + lane
            pair = tl.load(order_ptr + start + slot, mask=slot < count, other=sentinel)
            tl.store(sorted_pairs_ptr + offset + slot, pair.to(tl.int32), mask=slot < size)
        for b in range(0, size // BLOCK_M, BLOCK):
            block = b + lane
            expert = tl.zeros([BLOCK], dtype=tl.int32) + program
            first_block = block_expert_ptr + offset // BLOCK_M
            tl.store(first_block + block, expert, mask=block < size // BLOCK_M)
    else:
        total = tl.sum(padded)
        for r in range(total, max_padded, BLOCK):
            slot = r + lane
            fill = tl.zeros([BLOCK], dtype=tl.int32) + sentinel
            tl.store(sorted_pairs_ptr + slot, fill, mask=slot < max_padded)
        for b in range(total // BLOCK_M, max_padded // BLOCK_M, BLOCK):
            block = b + lane
            none = tl.zeros([BLOCK], dtype=tl.int32) - 1
            tl.store(block_expert_ptr + block, none, mask=block < max_padded // BLOCK_M)
        tl.store(num_padded_ptr, total.to(tl.int32))


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertLayout:
    """The ``(t, j)`` pairs of ``ids [T, k]`` grouped by expert (ascending pair index within
    one), each run padded to ``block_m``; six ops (a view, a stable sort, three outputs, one
    launch), none reading the device. Ids must lie in ``0..num_experts-1``."""
    num_pairs = ids.numel()
    flat = ids.reshape(-1)
    sorted_ids, order = torch.sort(flat, stable=True)
    size = max_padded(num_pairs, num_experts, block_m)
    int32 = {"dtype": torch.int32, "device": ids.device}
    sorted_pairs = torch.empty(size, **int32)
    block_expert = torch.empty(size // block_m, **int32)
    num_padded = torch.empty(1, **int32)
    _align_kernel[(num_experts + 1,)](
        sorted_ids,
        order,
        sorted_pairs,
        block_expert,
        num_padded,
        num_pairs,
        num_experts,
        size,
        num_pairs.bit_length(),  # halvings until every search interval is empty
        BLOCK_M=block_m,
        BLOCK_E=triton.next_power_of_2(num_experts),
        BLOCK=_ALIGN_BLOCK,
    )
    return ExpertLayout(sorted_pairs, block_expert, num_padded, block_m, num_pairs)


@triton.jit
def _block_rows(sorted_pairs_ptr, block, num_pairs, top_k, BLOCK_M: tl.constexpr):
    """This block's slots, their pairs, which of them are real, and their tokens."""
    slots = block.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit row offsets
    pairs = tl.load(sorted_pairs_ptr + slots).to(tl.int64)
    row_ok = pairs < num_pairs
    return slots, pairs, row_ok, pairs // top_k


@triton.jit
def _fused_gate_up_silu_kernel(
    x_ptr,
    w13_ptr,
    act_ptr,
    sorted_pairs_ptr,
    block_expert_ptr,
    num_padded_ptr,
    num_pairs,
    top_k,
    hidden,
    inter,
    stride_x,
    stride_w_expert,
    stride_w_row,
    stride_act,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    if block * BLOCK_M >= tl.load(num_padded_ptr):
        return  # past the last run: the grid is sized for the worst padding
    if tl.load(sorted_pairs_ptr + block.to(tl.int64) * BLOCK_M) >= num_pairs:
        return  # a block of padding only (a masked layout's unused rows): no weight read
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    slots, _, row_ok, tokens = _block_rows(sorted_pairs_ptr, block, num_pairs, top_k, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    w_base = w13_ptr + expert * stride_w_expert
    act = gate_up_silu_tile(
        x_ptr,
        tokens,
        row_ok,
        w_base,
        cols,
        col_ok,
        hidden,
        inter,
        stride_x,
        stride_w_row,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )
    tl.store(
        act_ptr + slots[:, None] * stride_act + cols[None, :],
        act.to(act_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


@triton.jit
def _fused_down_kernel(
    act_ptr,
    w2_ptr,
    buf_ptr,
    weights_ptr,
    sorted_pairs_ptr,
    block_expert_ptr,
    num_padded_ptr,
    num_pairs,
    top_k,
    hidden,
    inter,
    stride_act,
    stride_w_expert,
    stride_w_row,
    stride_weights_token,
    stride_weights_choice,
    stride_buf,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    if block * BLOCK_M >= tl.load(num_padded_ptr):
        return
    if tl.load(sorted_pairs_ptr + block.to(tl.int64) * BLOCK_M) >= num_pairs:
        return
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    slots, pairs, row_ok, tokens = _block_rows(sorted_pairs_ptr, block, num_pairs, top_k, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    w_base = w2_ptr + expert * stride_w_expert
    acc = down_tile(
        act_ptr,
        slots,
        row_ok,
        w_base,
        cols,
        col_ok,
        inter,
        stride_act,
        stride_w_row,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )
    choices = pairs % top_k
    weight = tl.load(
        weights_ptr + tokens * stride_weights_token + choices * stride_weights_choice,
        mask=row_ok,
        other=0.0,
    ).to(tl.float32)
    tl.store(
        buf_ptr + pairs[:, None] * stride_buf + cols[None, :],
        acc * weight[:, None],
        mask=row_ok[:, None] & col_ok[None, :],
    )


def fused_moe(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * w2[e] @ (silu(w13[e, :I] @ x[t]) * (w13[e, I:] @ x[t]))``
    with ``e = ids[t, j]``, for ``x [T, H]``, ``w13 [E, 2I, H]`` (gate rows then up rows) and
    ``w2 [E, H, I]``: every expert on this rank, no host read, grids sized by shapes only.

    Eleven ops in float32 (the layout's six, ``act``, two launches, ``buf`` and its sum),
    twelve in bfloat16 (the float32 sum cast back); one when ``T == 0``.
    """
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w2.shape[-1]
    if ids.shape[0] != num_tokens or weights.shape != ids.shape:
        raise ValueError(
            f"ids {tuple(ids.shape)} and weights {tuple(weights.shape)} must both be "
            f"[{num_tokens}, k] for x {tuple(x.shape)}"
        )
    if w13.shape[1:] != (2 * inter, hidden) or w2.shape != (num_experts, hidden, inter):
        raise ValueError(
            f"w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} must be [E, 2I, H] / [E, H, I] "
            f"with H {hidden}"
        )
    if num_tokens == 0:
        return x.new_empty(0, hidden)
    # The kernels step rows by their strides but read each row's elements densely.
    x = x if x.stride(-1) == 1 else x.contiguous()
    w13 = w13 if w13.stride(-1) == 1 else w13.contiguous()
    w2 = w2 if w2.stride(-1) == 1 else w2.contiguous()
    layout = align_by_expert(ids, num_experts, BLOCK_M)
    buf = _run_experts(x, w13, w2, layout, weights)
    out = buf.sum(1)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def _run_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    layout: ExpertLayout,
    weights: torch.Tensor,
) -> torch.Tensor:
    """The two expert kernels over ``layout``: ``[rows, k, H]`` float32, each real pair's row
    times its weight (rows of padding pairs are left unwritten)."""
    hidden, inter, top_k = x.shape[1], w2.shape[-1], weights.shape[1]
    num_blocks = layout.block_expert.shape[0]
    act = x.new_empty(layout.sorted_pairs.shape[0], inter)
    _fused_gate_up_silu_kernel[(num_blocks, triton.cdiv(inter, BLOCK_N))](
        x,
        w13,
        act,
        layout.sorted_pairs,
        layout.block_expert,
        layout.num_padded,
        layout.num_pairs,
        top_k,
        hidden,
        inter,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        act.stride(0),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
    )
    # One float32 row per pair, each written by exactly one program: the k-sum below is
    # in pair order (deterministic) and in float32 whatever x's dtype.
    rows = layout.num_pairs // top_k
    buf = torch.empty(rows, top_k, hidden, dtype=torch.float32, device=x.device)
    _fused_down_kernel[(num_blocks, triton.cdiv(hidden, BLOCK_N))](
        act,
        w2,
        buf,
        weights,
        layout.sorted_pairs,
        layout.block_expert,
        layout.num_padded,
        layout.num_pairs,
        top_k,
        hidden,
        inter,
        act.stride(0),
        w2.stride(0),
        w2.stride(1),
        weights.stride(0),
        weights.stride(1),
        buf.stride(1),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
    )
    return buf


@dataclass(frozen=True)
class _MaskedTables:
    """What a masked layout of ``E`` experts by ``M`` rows shares across calls (shapes only)."""

    rows: torch.Tensor  # int32 [E, Mp]: packed row e * M + i of slot (e, i)
    slot_in_run: torch.Tensor  # int32 [1, Mp]: i
    sentinel: torch.Tensor  # int32 []: E * M, the slot of no row
    block_expert: torch.Tensor  # int32 [E * Mp / BLOCK_M]
    num_padded: torch.Tensor  # int32 [1]: E * Mp
    ones: torch.Tensor  # float32 [E * M, 1]: the unit weights (the combine weighs)


_MASKED: dict[tuple[int, int, torch.device], _MaskedTables] = {}


def _masked_tables(experts: int, rows: int, device: torch.device) -> _MaskedTables:
    tables = _MASKED.get((experts, rows, device))
    if tables is None:
        padded = -(-rows // BLOCK_M) * BLOCK_M
        slot = torch.arange(padded, dtype=torch.int32, device=device)
        base = torch.arange(experts, dtype=torch.int32, device=device).unsqueeze(1) * rows
        block_expert = torch.arange(experts, dtype=torch.int32, device=device)
        tables = _MASKED[(experts, rows, device)] = _MaskedTables(
            base + slot,
            slot.unsqueeze(0),
            torch.tensor(experts * rows, dtype=torch.int32, device=device),
            block_expert.repeat_interleave(padded // BLOCK_M),
            torch.tensor([experts * padded], dtype=torch.int32, device=device),
            torch.ones(experts * rows, 1, dtype=torch.float32, device=device),
        )
    return tables


def masked_experts(
    packed: torch.Tensor, counts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    """The experts over DeepEP's low-latency layout: ``packed [E, M, H]`` holds ``counts[e]``
    (a device tensor) rows for local expert ``e`` at its start; returns ``[E, M, H]``, each
    valid row's *unweighted* output (the low-latency combine weighs), rows past the counts
    unspecified. The counts never reach the host and the grid follows the shapes, so the
    legs and the experts between them can be captured in a decode graph.

    The layout is ``fused_moe``'s with one pair per row (``k`` 1): slot ``(e, i)`` holds row
    ``e * M + i`` while ``i < counts[e]``, else the sentinel, so the kernels' blocks of
    padding exit before reading a weight; ten ops.
    """
    experts, rows, hidden = packed.shape
    if counts.shape != (experts,) or w13.shape[0] != experts or w2.shape[0] != experts:
        raise ValueError(
            f"counts {tuple(counts.shape)}, w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} "
            f"must all have the {experts} local experts of packed {tuple(packed.shape)}"
        )
    if packed.numel() == 0:
        return torch.empty_like(packed)
    tables = _masked_tables(experts, rows, packed.device)
    sentinel = experts * rows
    valid = tables.slot_in_run < counts.unsqueeze(1)
    sorted_pairs = torch.where(valid, tables.rows, tables.sentinel).view(-1)
    layout = ExpertLayout(sorted_pairs, tables.block_expert, tables.num_padded, BLOCK_M, sentinel)
    x = packed.view(sentinel, hidden)
    w13 = w13 if w13.stride(-1) == 1 else w13.contiguous()
    w2 = w2 if w2.stride(-1) == 1 else w2.contiguous()
    buf = _run_experts(x, w13, w2, layout, tables.ones)
    out = buf.view(experts, rows, hidden)
    return out if out.dtype == packed.dtype else out.to(packed.dtype)
