"""Tokens routed to each physical expert slot, per MoE layer, over a window of rounds.

What EPLB balances is measured where it happens: every MoE layer adds its dispatch's slot
ids into a device tensor (one ``index_add_``, no read back to the host, no collective), so
counting costs the forward almost nothing. The window is a ring of ``window_rounds + 1``
rows: the last ``window_rounds`` completed rounds and the (cleared) row of the round to come,
so a rebalance that reads it right after a round ends sees a whole window. The group sums it
(one all-reduce) only at a rebalance point.
"""

from __future__ import annotations

import torch


class ExpertLoad:
    """A ``[window_rounds + 1, num_layers, num_slots]`` ring of per-round slot counts."""

    def __init__(
        self, num_layers: int, num_slots: int, window_rounds: int, device: torch.device | str
    ) -> None:
        if window_rounds < 1:
            raise ValueError(f"--eplb-window-rounds must be >= 1, got {window_rounds}")
        self.window_rounds = window_rounds
        self.counts = torch.zeros(
            window_rounds + 1, num_layers, num_slots, dtype=torch.long, device=device
        )
        self.slot = 0  # the ring row this round counts into
        self.rounds = 0  # rounds counted since the last reset (<= the window)
        self._ones = torch.ones(0, dtype=torch.long, device=device)

    def record(self, layer: int, slots: torch.Tensor) -> None:
        """Count one layer's dispatched ``(token, slot)`` choices into this round's row."""
        flat = slots.reshape(-1)
        if self._ones.shape[0] < flat.shape[0]:
            self._ones = torch.ones(flat.shape[0] * 2, dtype=torch.long, device=flat.device)
        self.counts[self.slot, layer].index_add_(0, flat, self._ones[: flat.shape[0]])

    def end_round(self) -> None:
        """Move to the next ring row (cleared: it held the round one window ago)."""
        self.slot = (self.slot + 1) % self.counts.shape[0]
        self.counts[self.slot].zero_()
        self.rounds = min(self.rounds + 1, self.window_rounds)

    def window(self) -> torch.Tensor:
        """``[num_layers, num_slots]``: this rank's tokens per slot over the last
        ``window_rounds`` completed rounds (and the current one's, if it recorded any)."""
        return self.counts.sum(dim=0)

    def reset(self) -> None:
        """Forget the window (the slots changed meaning: a new placement)."""
        self.counts.zero_()
        self.rounds = 0
