"""All experts on this rank (dp = 1): dispatch is a sort, combine a weighted scatter-add."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roundgate.kernels.moe.base import Dispatched, MoEBackend, group_by_expert
from roundgate.kernels.moe.placement import ExpertPlacement


@dataclass
class _LocalHandle:
    token_of_row: torch.Tensor  # [N] source token of each grouped row
    weight_of_row: torch.Tensor  # [N] router weight of each grouped row
    num_tokens: int


class LocalMoE(MoEBackend):
    """No communication: the reference every distributed backend must agree with."""

    name = "local"

    def __init__(self, placement: ExpertPlacement) -> None:
        if placement.world_size != 1:
            raise ValueError("--moe-backend local holds every expert: it needs --dp-size 1")
        self.placement = placement

    @property
    def needs_collectives(self) -> bool:
        return False

    def dispatch(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        low_latency: bool,
    ) -> Dispatched:
        del low_latency  # no wire, no modes
        top_k = topk_ids.shape[1]
        order, counts = group_by_expert(topk_ids.reshape(-1), self.placement.num_physical_experts)
        token_of_row = order // top_k
        handle = _LocalHandle(token_of_row, topk_weights.reshape(-1)[order], hidden.shape[0])
        return Dispatched(hidden.index_select(0, token_of_row), counts, handle)

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        handle: _LocalHandle = dispatched.handle
        return weighted_scatter_add(
            expert_out, handle.token_of_row, handle.weight_of_row, handle.num_tokens
        )


def weighted_scatter_add(
    rows: torch.Tensor, token_of_row: torch.Tensor, weights: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """``out[t] = sum of weights[r] * rows[r] over rows r of token t`` (rows in expert order).

    Rows are added in ascending expert order per token, the same order transformers'
    Mixtral uses, so float32 results match it closely.
    """
    out = rows.new_zeros(num_tokens, rows.shape[1])
    weighted = rows * weights.to(rows.dtype).unsqueeze(1)
    return out.index_add_(0, token_of_row, weighted)
