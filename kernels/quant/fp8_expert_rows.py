"""FP8 expert weights kept with their block scales in one byte row per expert slot.

A MoE layer holds its experts as ``w13 [slots, ...]`` and ``w2 [slots, ...]``, and everything
that moves experts between slots moves rows of those two tensors: EPLB's rebalance
(``expert_balance``), elastic re-homing (``expert_rehome``), loading one slot from the files.
Kept FP8, a slot is e4m3 codes *and* float32 block scales; laid out as one ``uint8`` row per
slot (codes, padding to 16 bytes, scales), the scales travel with their codes through every one
of those paths unchanged, and ``model.to(dtype)`` leaves bytes alone. The kernels read views::

    row of slot e:  | codes [N, K] e4m3 (N*K bytes) | pad | scale_inv [SR, SC] float32 |
    codes  = rows[:, :N*K].view(e4m3).view(E, N, K)            (strides row_bytes, K, 1)
    scales = rows[:, off:].view(float32).view(E, SR, SC)       (strides row_bytes/4, SC, 1)

``w13``'s scales are the gate's block rows then the up's (``triton_fp8_experts``' layout), so
the intermediate size need not be a multiple of 128.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roundgate.kernels.quant.fp8_blocks import FP8_DTYPE, dequantize_weight_blocks, num_blocks

ALIGN = 16  # the scales start on a 16-byte boundary (a float32 view needs 4)


@dataclass(frozen=True)
class Fp8ExpertRows:
    """The byte layout of one FP8 expert weight ``[rows, cols]`` and its ``[scale_rows,
    scale_cols]`` block scales."""

    rows: int
    cols: int
    scale_rows: int
    scale_cols: int

    @staticmethod
    def gate_up(hidden: int, inter: int) -> Fp8ExpertRows:
        """``w13 [2I, H]``: gate then up, each projection's block scales stacked."""
        return Fp8ExpertRows(2 * inter, hidden, 2 * num_blocks(inter), num_blocks(hidden))

    @staticmethod
    def down(hidden: int, inter: int) -> Fp8ExpertRows:
        """``w2 [H, I]``."""
        return Fp8ExpertRows(hidden, inter, num_blocks(hidden), num_blocks(inter))

    @property
    def scale_offset(self) -> int:
        return -(-self.rows * self.cols // ALIGN) * ALIGN

    @property
    def row_bytes(self) -> int:
        """Bytes one slot takes: its codes, the padding and four per block scale."""
        return self.scale_offset + 4 * self.scale_rows * self.scale_cols

    def allocate(self, slots: int) -> torch.Tensor:
        """Zeroed rows for ``slots`` experts (a zero row is an all-zero expert)."""
        return torch.zeros(slots, self.row_bytes, dtype=torch.uint8)

    def views(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes [E, rows, cols] e4m3, scale_inv [E, SR, SC] float32)``: views of
        ``packed`` (no copy; writes through)."""
        slots = packed.shape[0]
        codes = packed[:, : self.rows * self.cols].view(FP8_DTYPE)
        scales = packed[:, self.scale_offset :].view(torch.float32)
        return (
            codes.view(slots, self.rows, self.cols),
            scales.view(slots, self.scale_rows, self.scale_cols),
        )

    def write(self, row: torch.Tensor, codes: torch.Tensor, scale_inv: torch.Tensor) -> None:
        """Store one expert's ``codes`` and ``scale_inv`` into its byte ``row``."""
        if tuple(codes.shape) != (self.rows, self.cols) or codes.dtype != FP8_DTYPE:
            raise ValueError(
                f"FP8 expert: codes {codes.dtype} {list(codes.shape)}, expected e4m3 "
                f"{[self.rows, self.cols]}"
            )
        if tuple(scale_inv.shape) != (self.scale_rows, self.scale_cols):
            raise ValueError(
                f"FP8 expert: scale_inv {list(scale_inv.shape)}, expected "
                f"{[self.scale_rows, self.scale_cols]}"
            )
        codes_view, scales_view = self.views(row.unsqueeze(0))
        codes_view[0].view(torch.uint8).copy_(codes.view(torch.uint8))
        scales_view[0].copy_(scale_inv.float())


def dequantize_gate_up(codes: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """One expert's float32 ``w13 [2I, H]`` from its codes and stacked gate/up scales."""
    inter, split = codes.shape[0] // 2, scale_inv.shape[0] // 2
    return torch.cat(
        [
            dequantize_weight_blocks(codes[:inter], scale_inv[:split]),
            dequantize_weight_blocks(codes[inter:], scale_inv[split:]),
        ]
    )


def dequantize_rows(
    w13: torch.Tensor, w13_rows: Fp8ExpertRows, w2: torch.Tensor, w2_rows: Fp8ExpertRows
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every slot's float32 ``(w13 [E, 2I, H], w2 [E, H, I])``: what ``run_experts`` takes."""
    (c13, s13), (c2, s2) = w13_rows.views(w13), w2_rows.views(w2)
    empty13 = torch.empty(0, w13_rows.rows, w13_rows.cols, device=w13.device)
    empty2 = torch.empty(0, w2_rows.rows, w2_rows.cols, device=w2.device)
    gate_up = [dequantize_gate_up(c, s) for c, s in zip(c13, s13, strict=True)]
    down = [dequantize_weight_blocks(c, s) for c, s in zip(c2, s2, strict=True)]
    return (
        torch.stack(gate_up) if gate_up else empty13,
        torch.stack(down) if down else empty2,
    )
