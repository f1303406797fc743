"""Expert parallelism over ``torch.distributed.all_to_all_single`` (gloo on CPU, NCCL on GPU).

Dispatch, per MoE layer::

    sort (token, expert) pairs by expert      -> destination ranks are contiguous runs
    all_to_all counts                          -> everyone learns its receive splits
    all_to_all hidden rows, all_to_all ids     -> rows for my experts (grouped by source)
    regroup by local expert                    -> Dispatched

Combine runs the same legs backwards and applies the router weights on the source rank,
so only unweighted rows travel. A rank with no tokens sends zero rows but still joins all
four collectives, which is what keeps an idle rank from deadlocking the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from roundgate.kernels.moe.base import Dispatched, MoEBackend, group_by_expert
from roundgate.kernels.moe.local import weighted_scatter_add
from roundgate.kernels.moe.placement import ExpertPlacement


@dataclass
class _A2AHandle:
    send_splits: list[int]  # rows this rank sent to each rank
    recv_splits: list[int]  # rows this rank received from each rank
    regroup: torch.Tensor  # received-row order -> grouped-by-local-expert order
    token_of_row: torch.Tensor  # [sent rows] source token of each sent row
    weight_of_row: torch.Tensor  # [sent rows] router weight of each sent row
    num_tokens: int


class TorchAllToAllMoE(MoEBackend):
    """Experts sharded over ``group`` (contiguous blocks, see ``ExpertPlacement``)."""

    name = "torch"

    def __init__(self, placement: ExpertPlacement, group: Any = None) -> None:
        self.placement = placement
        self.group = group

    @property
    def needs_collectives(self) -> bool:
        return self.placement.world_size > 1

    def _all_to_all(
        self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]
    ) -> None:
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group)

    def dispatch(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        low_latency: bool,
    ) -> Dispatched:
        del low_latency  # one wire format for every round
        place = self.placement
        top_k = topk_ids.shape[1]
        flat_ids = topk_ids.reshape(-1)
        order, per_expert = group_by_expert(flat_ids, place.num_physical_experts)
        n = place.num_local_experts
        send_splits = [sum(per_expert[r * n : (r + 1) * n]) for r in range(place.world_size)]
        token_of_row = order // top_k
        send_rows = hidden.index_select(0, token_of_row)
        send_ids = flat_ids.index_select(0, order)

        # On the data's device: NCCL only moves CUDA tensors (gloo is happy either way).
        counts_in = torch.tensor(send_splits, dtype=torch.long, device=hidden.device)
        counts_out = torch.empty_like(counts_in)
        dist.all_to_all_single(counts_out, counts_in, group=self.group)
        recv_splits = counts_out.tolist()
        num_recv = sum(recv_splits)
        recv_rows = hidden.new_empty(num_recv, hidden.shape[1])
        self._all_to_all(recv_rows, send_rows, recv_splits, send_splits)
        recv_ids = torch.empty(num_recv, dtype=torch.long, device=hidden.device)
        self._all_to_all(recv_ids, send_ids, recv_splits, send_splits)

        regroup, counts = group_by_expert(recv_ids - place.first_local_expert, n)
        handle = _A2AHandle(
            send_splits,
            recv_splits,
            regroup,
            token_of_row,
            topk_weights.reshape(-1).index_select(0, order),
            hidden.shape[0],
        )
        return Dispatched(recv_rows.index_select(0, regroup), counts, handle)

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        handle: _A2AHandle = dispatched.handle
        # Back into received order, then home along the reversed splits.
        in_recv_order = torch.empty_like(expert_out)
        in_recv_order[handle.regroup] = expert_out
        home = expert_out.new_empty(sum(handle.send_splits), expert_out.shape[1])
        self._all_to_all(home, in_recv_order, handle.send_splits, handle.recv_splits)
        return weighted_scatter_add(
            home, handle.token_of_row, handle.weight_of_row, handle.num_tokens
        )
