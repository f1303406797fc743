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

# DeepEP's envelope, from its source at the image's pin (v1.2.1, see the Dockerfile): the
# kernels refuse anything else with an EP_HOST_ASSERT in the middle of a round, so the adapter
# checks it at construction (startup) with the setting to change.
# The hidden sizes the low-latency kernels are compiled for: ``SWITCH_HIDDEN`` in
# csrc/kernels/launch.cuh (DeepSeek-V3's 7168, V2's 5120, Qwen3-MoE's 2048/4096/6144 ...).
LOW_LATENCY_HIDDEN_SIZES = frozenset({2048, 2560, 4096, 5120, 6144, 7168, 8192})
# Expert-parallel group sizes both leg kinds run on (our buffer serves normal and low-latency
# legs): one node of 2, 4 or 8 GPUs (``SWITCH_RANKS`` in launch.cuh), or 8 per node over RDMA
# with 2, 4, 8, 16, 18 or 20 nodes (``SWITCH_RDMA_RANKS``, ``NUM_MAX_NVL_PEERS`` = 8 in
# csrc/kernels/configs.cuh; deep_ep/buffer.py's dispatch/combine configs cover all of these).
SUPPORTED_NUM_RANKS = frozenset({2, 4, 8, 16, 32, 64, 128, 144, 160})
# The one activation type the legs move: ``Buffer::low_latency_dispatch`` asserts
# ``x.scalar_type() == torch::kBFloat16`` (csrc/deep_ep.cpp; FP8 is cast inside, from bf16)
# and the combine kernels' ``SWITCH_TYPES`` has only ``CUDA_R_16BF`` (launch.cuh).
ACTIVATION_DTYPES = frozenset({torch.bfloat16})


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
    """Expert dispatch/combine through a ``deep_ep.Buffer`` built at construction.

    The buffer is built here, at startup, not on the first dispatch: building it is a
    collective over the group (every rank exchanges its buffer handles), so every rank builds
    it at the same point, and no request pays for it.
    """

    name = "deepep"
    # DeepEP's envelope (module constants above). Test-only switch: tests/test_moe.py widens
    # these on a subclass to run toy shapes (one rank, hidden 16, float32) on its CPU fake,
    # whose checks are widened the same way; production code never overrides them.
    supported_hidden_sizes: frozenset[int] = LOW_LATENCY_HIDDEN_SIZES
    supported_num_ranks: frozenset[int] = SUPPORTED_NUM_RANKS
    activation_dtypes: frozenset[torch.dtype] = ACTIVATION_DTYPES

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
        self._check_envelope()
        self._deep_ep = deep_ep if deep_ep is not None else importlib.import_module("deep_ep")
        # Mode of the previous round's legs; DeepEP needs its low-latency buffer cleaned
        # after normal kernels have used it.
        self.last_mode: str | None = None
        # The low-latency legs hand the experts DeepEP's packed layout and device counts
        # (``take_masked_experts``) instead of reading the counts to unpack it.
        self.masked = False
        self._buffer = self._build_buffer()

    def _check_envelope(self) -> None:
        """``ValueError`` naming the setting for what DeepEP's kernels would refuse."""
        if self.hidden_size not in self.supported_hidden_sizes:
            sizes = ", ".join(map(str, sorted(self.supported_hidden_sizes)))
            raise ValueError(
                f"--moe-backend deepep: the model's hidden_size {self.hidden_size} is not one "
                f"DeepEP's low-latency kernels are built for ({sizes}); use --moe-backend torch"
            )
        ranks = self.placement.world_size
        if ranks not in self.supported_num_ranks:
            counts = ", ".join(map(str, sorted(self.supported_num_ranks)))
            raise ValueError(
                f"--moe-backend deepep runs on expert-parallel groups of {counts} ranks, "
                f"got --dp-size {ranks}"
            )
        if self.max_dispatch_tokens_per_rank <= 0:
            # DeepEP sizes the low-latency buffers by this cap (get_low_latency_rdma_size_hint)
            # and asserts every dispatch holds at most that many tokens.
            raise ValueError(
                "--moe-backend deepep needs a positive per-rank token cap "
                "(max_dispatch_tokens_per_rank = --max-num-seqs // --dp-size), got "
                f"{self.max_dispatch_tokens_per_rank}"
            )

    def _build_buffer(self) -> Any:
        buffer_cls = self._deep_ep.Buffer
        rdma_bytes = buffer_cls.get_low_latency_rdma_size_hint(
            self.max_dispatch_tokens_per_rank,
            self.hidden_size,
            self.placement.world_size,
            self.placement.num_physical_experts,
        )
        return buffer_cls(
            self.group,
            num_nvl_bytes=NORMAL_NVL_BYTES,
            num_rdma_bytes=rdma_bytes,
            low_latency_mode=True,
            num_qps_per_rank=self.placement.num_local_experts,
        )

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
        """The ``deep_ep.Buffer`` built at construction."""
        return self._buffer

    def dispatch(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        low_latency: bool,
    ) -> Dispatched:
        if hidden.dtype not in self.activation_dtypes:
            allowed = ", ".join(sorted(map(str, self.activation_dtypes)))
            raise ValueError(
                f"--moe-backend deepep dispatches {allowed} activations only, got "
                f"{hidden.dtype}: serve the model in bfloat16 or use --moe-backend torch"
            )
        # DeepEP asserts contiguous rows, int64 ids and float32 weights (csrc/deep_ep.cpp).
        hidden = hidden.contiguous()
        topk_ids = topk_ids.to(torch.int64).contiguous()
        topk_weights = topk_weights.to(torch.float32).contiguous()
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
