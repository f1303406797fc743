"""DeepEP adapter: low-latency legs on decode-or-idle rounds, normal legs otherwise.

``deep_ep`` is imported only when this backend is built (it needs CUDA and NVSHMEM); tests
pass a fake module. The mode is a per-round group decision: ``low_latency`` comes from the
gathered rows (``roundgate.actors.control.executor.is_low_latency``), identical on every rank, so
all ranks launch the same kernels. Low-latency kernels take a fixed per-rank token cap and skip the
layout handshake, which is why a single extending rank (thousands of tokens) forces the
whole group onto the normal legs for that round.

Wire formats, as DeepEP defines them:

- normal: ``dispatch`` returns each received *token* once with its top-k ids remapped to
  local experts (-1 = not mine); ``combine`` sums per-token rows **without** weights, so we
  weight per (token, expert) row and reduce per token before combining.
- low-latency: ``low_latency_dispatch`` returns ``[local_experts, cap * ranks, H]`` with a
  per-expert valid count; ``low_latency_combine`` applies the router weights itself.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from roundgate.kernels.moe.base import Dispatched, MoEBackend, group_by_expert
from roundgate.kernels.moe.placement import ExpertPlacement

NORMAL_NVL_BYTES = 1 << 30


@dataclass
class _NormalHandle:
    deep_handle: Any
    token_of_row: torch.Tensor  # [N] received-token index of each grouped row
    weight_of_row: torch.Tensor  # [N]
    num_recv_tokens: int


@dataclass
class _LowLatencyHandle:
    deep_handle: Any
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    packed_shape: tuple[int, ...]


class DeepEPMoE(MoEBackend):
    """Expert dispatch/combine through a ``deep_ep.Buffer`` built on first use."""

    name = "deepep"

    def __init__(
        self,
        placement: ExpertPlacement,
        group: Any,
        hidden_size: int,
        max_dispatch_tokens_per_rank: int,
        deep_ep: ModuleType | Any = None,
    ) -> None:
        self.placement = placement
        self.group = group
        self.hidden_size = hidden_size
        self.max_dispatch_tokens_per_rank = max_dispatch_tokens_per_rank
        self._deep_ep = deep_ep if deep_ep is not None else importlib.import_module("deep_ep")
        self._buffer: Any = None
        # Mode of the previous round's legs; DeepEP needs its low-latency buffer cleaned
        # after normal kernels have used it.
        self.last_mode: str | None = None
        # The low-latency legs hand the experts DeepEP's packed layout and device counts
        # (``take_masked_experts``) instead of reading the counts to unpack it.
        self.masked = False

    def take_masked_experts(self) -> bool:
        self.masked = True
        return True

    @property
    def is_graph_safe(self) -> bool:
        """With the masked experts the low-latency legs read nothing back: DeepEP sizes
        their buffers by ``max_dispatch_tokens_per_rank``, and a decode graph replays them."""
        return self.masked

    @property
    def needs_collectives(self) -> bool:
        return True

    @property
    def buffer(self) -> Any:
        if self._buffer is None:
            buffer_cls = self._deep_ep.Buffer
            rdma_bytes = buffer_cls.get_low_latency_rdma_size_hint(
                self.max_dispatch_tokens_per_rank,
                self.hidden_size,
                self.placement.world_size,
                self.placement.num_physical_experts,
            )
            self._buffer = buffer_cls(
                self.group,
                num_nvl_bytes=NORMAL_NVL_BYTES,
                num_rdma_bytes=rdma_bytes,
                low_latency_mode=True,
                num_qps_per_rank=self.placement.num_local_experts,
            )
        return self._buffer

    def dispatch(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        low_latency: bool,
    ) -> Dispatched:
        topk_ids = topk_ids.to(torch.int64)
        topk_weights = topk_weights.to(torch.float32)
        if low_latency:
            return self._dispatch_low_latency(hidden, topk_ids, topk_weights)
        return self._dispatch_normal(hidden, topk_ids, topk_weights)

    def combine(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        if isinstance(dispatched.handle, _LowLatencyHandle):
            return self._combine_low_latency(expert_out, dispatched)
        return self._combine_normal(expert_out, dispatched)

    # -- normal legs ------------------------------------------------------------------------

    def _dispatch_normal(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> Dispatched:
        buf = self.buffer
        per_rank, per_rdma_rank, per_expert, in_rank, _ = buf.get_dispatch_layout(
            topk_ids, self.placement.num_physical_experts
        )
        recv_x, recv_ids, recv_weights, _, deep_handle, _ = buf.dispatch(
            hidden,
            topk_idx=topk_ids,
            topk_weights=topk_weights,
            num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
        )
        self.last_mode = "normal"
        token, slot = (recv_ids >= 0).nonzero(as_tuple=True)
        local_ids = recv_ids[token, slot]
        order, counts = group_by_expert(local_ids, self.placement.num_local_experts)
        token, slot = token[order], slot[order]
        handle = _NormalHandle(deep_handle, token, recv_weights[token, slot], recv_x.shape[0])
        return Dispatched(recv_x.index_select(0, token), counts, handle)

    def _combine_normal(self, expert_out: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        handle: _NormalHandle = dispatched.handle
        per_token = expert_out.new_zeros(handle.num_recv_tokens, expert_out.shape[1])
        weighted = expert_out * handle.weight_of_row.to(expert_out.dtype).unsqueeze(1)
        per_token.index_add_(0, handle.token_of_row, weighted)
        combined, _, _ = self.buffer.combine(per_token, handle.deep_handle)
        return combined

    # -- low-latency legs -------------------------------------------------------------------

    def _dispatch_low_latency(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> Dispatched:
        cap = self.max_dispatch_tokens_per_rank
        if hidden.shape[0] > cap:
            raise ValueError(
                f"DeepEP low-latency dispatch of {hidden.shape[0]} tokens exceeds the per-rank "
                f"cap {cap} (a decode round holds at most max_num_seqs // dp_size tokens)"
            )
        buf = self.buffer
        if self.last_mode == "normal":
            buf.clean_low_latency_buffer(cap, self.hidden_size, self.placement.num_physical_experts)
        packed, recv_counts, deep_handle, _, _ = buf.low_latency_dispatch(
            hidden, topk_ids, cap, self.placement.num_physical_experts, use_fp8=False
        )
        self.last_mode = "low_latency"
        handle = _LowLatencyHandle(deep_handle, topk_ids, topk_weights, tuple(packed.shape))
        if self.masked:
            return Dispatched(packed, [], handle, device_counts=recv_counts)
        counts = [int(c) for c in recv_counts.tolist()]
        rows = torch.cat([packed[e, :c] for e, c in enumerate(counts)])
        return Dispatched(rows, counts, handle)

    def _combine_low_latency(
        self, expert_out: torch.Tensor, dispatched: Dispatched
    ) -> torch.Tensor:
        handle: _LowLatencyHandle = dispatched.handle
        if dispatched.device_counts is not None:  # already DeepEP's packed layout
            packed = expert_out
        else:
            packed = expert_out.new_zeros(handle.packed_shape)
            start = 0
            for expert, count in enumerate(dispatched.counts):
                packed[expert, :count] = expert_out[start : start + count]
                start += count
        combined, _, _ = self.buffer.low_latency_combine(
            packed, handle.topk_ids, handle.topk_weights, handle.deep_handle
        )
        return combined
