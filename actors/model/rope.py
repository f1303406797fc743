"""RoPE: frequencies (default, llama3, yarn — transformers' formulas), the per-position table,
and the rotation itself (non-interleaved halves; interleaved checkpoints are permuted at load).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from roundgate.actors.model.config_parts import RopeScaling


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 when not stretched)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def inv_frequencies(dim: int, theta: float, scaling: RopeScaling) -> tuple[torch.Tensor, float]:
    """``(inv_freq [dim/2], attention_factor)``; the factor multiplies cos and sin."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    base = theta**exponents
    inv_freq = 1.0 / base
    if scaling.kind == "llama3":
        old = scaling.original_max_position
        low_wavelen, high_wavelen = old / scaling.low_freq_factor, old / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (old / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    if scaling.kind == "yarn":
        return _yarn(dim, theta, base, scaling)
    return inv_freq, 1.0


def _yarn(dim: int, theta: float, base: torch.Tensor, s: RopeScaling) -> tuple[torch.Tensor, float]:
    factor = s.factor
    attention = s.attention_factor
    if attention is None:
        if s.mscale and s.mscale_all_dim:
            attention = yarn_mscale(factor, s.mscale) / yarn_mscale(factor, s.mscale_all_dim)
        else:
            attention = yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        length = s.original_max_position
        return (dim * math.log(length / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * base)) * (1 - extrapolation) + (1.0 / base) * extrapolation
    return inv_freq, float(attention)


class RotaryTable(nn.Module):
    """Precomputed cos/sin for every position up to ``max_position`` (non-interleaved RoPE),
    already multiplied by the scaling's attention factor (YaRN), as transformers does."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        theta: float,
        scaling: RopeScaling | None = None,
    ) -> None:
        super().__init__()
        inv_freq, factor = inv_frequencies(head_dim, theta, scaling or RopeScaling())
        angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", angles.cos() * factor, persistent=False)
        self.register_buffer("sin", angles.sin() * factor, persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """``[T, 1, D]`` tables for ``apply_rope`` at ``positions``: ``cat(cos, cos)`` and
        the sign-folded ``cat(-sin, sin)``, built once per forward for every layer."""
        cos, sin = self.cos[positions], self.sin[positions]
        return (
            torch.cat((cos, cos), dim=-1).unsqueeze(1).to(dtype),
            torch.cat((-sin, sin), dim=-1).unsqueeze(1).to(dtype),
        )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves: ``x * cos + cat(x2, x1) * cat(-sin, sin)``, which is bit-for-bit
    transformers' ``x * cos + rotate_half(x) * sin`` (negating a factor is exact)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((x2, x1), dim=-1) * signed_sin


def deinterleave_rows(weight: torch.Tensor, rope_dim: int, groups: int) -> torch.Tensor:
    """Reorder the output rows of a projection so that each of its ``groups`` trailing
    ``rope_dim`` blocks reads (x0, x2, ..., x1, x3, ...) instead of pairs (x0, x1), (x2, x3).

    Interleaved RoPE on pairs then equals ``apply_rope`` on halves, exactly: the permutation
    moves whole rows, and q.k is unchanged when q and k are permuted alike.
    """
    rows = weight.shape[0] // groups
    blocks = weight.reshape(groups, rows, *weight.shape[1:]).clone()
    rope = blocks[:, rows - rope_dim :]
    blocks[:, rows - rope_dim :] = torch.cat((rope[:, 0::2], rope[:, 1::2]), dim=1)
    return blocks.reshape(weight.shape)
