"""Sparse MoE blocks: the router (softmax or sigmoid scores, greedy or grouped choice) and the
expert layer with its optional shared expert, over any ``MoEBackend``.

One block, on one rank::

    weights, ids = router(x)                    # [T, k] float32, [T, k] logical expert ids
    slots = expert_map.to_physical(ids, pos)    # the copy each choice goes to (EPLB)
    load.record(layer, slots)                   # --enable-eplb: tokens per slot, on device
    rows = backend.dispatch(x, slots, weights)  # the (token, slot) pairs for MY slots
    out = backend.combine(experts(rows))        # --moe-kernel: torch GEMM pairs or Triton
    out += sigmoid(gate(x)) * shared(x)         # Qwen2-MoE; DeepSeek's shared expert ungated
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from roundgate.actors.model.config import ModelConfig
from roundgate.actors.model.fp8 import Fp8Tensor, kept_fp8, stored_fp8
from roundgate.actors.model.fused_path import FusedKernels
from roundgate.actors.model.layers import DenseMLP, ForwardContext, fill, linear, param
from roundgate.actors.model.weights import TensorSource
from roundgate.kernels.moe.base import ExpertsKernel, MoEBackend, run_experts
from roundgate.kernels.moe.eplb import initial_placement
from roundgate.kernels.moe.expert_load import ExpertLoad
from roundgate.kernels.moe.expert_map import ExpertMap
from roundgate.kernels.moe.placement import ExpertPlacement
from roundgate.kernels.moe.registry import fp8_experts_kernel
from roundgate.kernels.quant.fp8_expert_rows import Fp8ExpertRows, dequantize_rows


class Router(nn.Module):
    """Top-k expert choice, exactly as each family's transformers router computes it.

    Logits in float32. Softmax families take the top-k probabilities (renormalised when
    ``norm_topk_prob``); V2's ``group_limited_greedy`` first keeps the ``topk_group`` groups
    with the best single expert; V3 chooses on ``sigmoid + e_score_correction_bias`` within the
    groups whose two best biased scores sum highest, then weighs by the unbiased sigmoid.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config.router
        self.num_experts, self.top_k = config.num_experts, config.top_k
        self.weight = param(config.num_experts, config.hidden_size)
        sigmoid = config.router.scoring == "sigmoid"
        self.e_score_correction_bias = param(config.num_experts) if sigmoid else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        logits = F.linear(x.float(), self.weight.float())
        if self.e_score_correction_bias is not None:
            scores = logits.sigmoid()
            choice = scores + self.e_score_correction_bias.float()
        else:
            scores = torch.softmax(logits, dim=-1)
            choice = scores
        if cfg.is_grouped:
            groups = choice.view(-1, cfg.n_group, self.num_experts // cfg.n_group)
            if cfg.topk_method == "noaux_tc":
                group_scores = groups.topk(2, dim=-1)[0].sum(dim=-1)
            else:
                group_scores = groups.max(dim=-1).values
            best = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
            keep = keep.unsqueeze(-1).expand_as(groups).reshape(-1, self.num_experts)
            masked = float("-inf") if cfg.topk_method == "noaux_tc" else 0.0
            choice = choice.masked_fill(~keep, masked)
        if cfg.is_grouped or self.e_score_correction_bias is not None:
            ids = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
            weights = scores.gather(1, ids)
        else:
            weights, ids = torch.topk(scores, self.top_k, dim=-1)
        if cfg.norm_topk_prob:
            # DeepSeek guards the sum with 1e-20; the softmax families divide plainly.
            tiny = 1e-20 if cfg.scoring == "sigmoid" or cfg.is_grouped else 0.0
            weights = weights / (weights.sum(dim=-1, keepdim=True) + tiny)
        if cfg.routed_scaling_factor != 1.0:
            weights = weights * cfg.routed_scaling_factor
        return weights, ids

    def fused(
        self, x: torch.Tensor, route: Callable[..., Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` with everything after the logits in one Triton launch (``route``:
        ``kernels/moe/triton_router``); the logits stay a float32 GEMM, as in ``forward``."""
        cfg, weight = self.config, self.weight
        as_float = x if x.dtype == torch.float32 else x.float()
        logits = F.linear(as_float, weight if weight.dtype == torch.float32 else weight.float())
        return route(
            logits,
            self.e_score_correction_bias,
            scoring=cfg.scoring,
            n_group=cfg.n_group,
            topk_group=cfg.topk_group,
            topk_method=cfg.topk_method,
            top_k=self.top_k,
            norm_topk_prob=cfg.norm_topk_prob,
            routed_scaling_factor=cfg.routed_scaling_factor,
        )


class SparseMoE(nn.Module):
    """Routed experts (only this rank's slots, ``w13``/``w2`` stacked by local slot) plus an
    optional shared expert; the backend moves tokens to whichever rank holds their experts.

    ``expert_map`` says which logical expert each slot holds (the static blocks until an
    EPLB rebalance swaps it); ``moe_index`` is this layer's ordinal among the MoE layers (its
    row of the load statistics).
    """

    def __init__(self, config: ModelConfig, placement: ExpertPlacement, moe_index: int) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.moe_intermediate_size
        self.gate = Router(config)
        self.moe_index = moe_index
        self.expert_map = ExpertMap(placement, initial_placement(placement.layout()))
        slots = placement.num_local_experts
        self.w13 = param(slots, 2 * inter, hidden)  # gate (w1) then up (w3)
        self.w2 = param(slots, hidden, inter)
        # Kept FP8 (``--fp8-weights``): the byte layouts of ``w13``/``w2``'s rows, set at load.
        self.fp8_rows: tuple[Fp8ExpertRows, Fp8ExpertRows] | None = None
        shared = config.shared_expert_intermediate_size
        self.shared = DenseMLP(hidden, shared) if shared else None
        self.shared_gate = linear(hidden, 1, bias=False) if config.shared_expert_gate else None

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        if ctx is None:
            return self.run(x, None, False)
        if ctx.fused_moe and ctx.fused is not None:  # every layer ``runs_fused`` (checked once)
            return self.run_fused(x, ctx, ctx.fused)
        positions = ctx.batch.positions
        return self.run(x, ctx.moe, ctx.low_latency, ctx.experts, positions, ctx.expert_load)

    def run(
        self,
        x: torch.Tensor,
        moe: MoEBackend | None,
        low_latency: bool,
        experts: ExpertsKernel = run_experts,
        positions: torch.Tensor | None = None,
        load: ExpertLoad | None = None,
    ) -> torch.Tensor:
        if moe is None:
            raise ValueError("a MoE layer needs an MoE backend in the forward context")
        weights, ids = self.gate(x)
        slots = self.expert_map.to_physical(ids, positions)
        if load is not None:
            load.record(self.moe_index, slots)
        dispatched = moe.dispatch(x, slots, weights, low_latency=low_latency)
        if dispatched.device_counts is not None:  # DeepEP's packed layout: no count read
            computed = self.run_masked_experts(dispatched.hidden, dispatched.device_counts)
        elif self.fp8_rows is None:
            computed = experts(dispatched.hidden, dispatched.counts, self.w13, self.w2)
        else:
            computed = self.run_fp8_experts(dispatched.hidden, dispatched.counts, experts)
        out = moe.combine(computed, dispatched)
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return out

    @property
    def runs_fused(self) -> bool:
        """Whether the fused path can take this layer: its experts unquantized, each logical
        expert in its own slot (no EPLB copies to choose among), a router the kernel has."""
        from roundgate.kernels.moe.triton_router import supports

        return self.fp8_rows is None and self.expert_map.identity and supports(self.gate.config)

    def run_fused(
        self, x: torch.Tensor, ctx: ForwardContext, kernels: FusedKernels
    ) -> torch.Tensor:
        """The block on one rank that holds every expert, on the device only: the router's
        choice goes straight into the fused experts (``kernels/moe/triton_fused_moe``), which
        group the rows by expert on the device and weigh and sum each token's experts, so no
        expert count is read back and every shape follows the batch (capturable)."""
        weights, ids = self.gate.fused(x, kernels.route)
        out = kernels.fused_moe(x, ids, weights, self.w13, self.w2)
        if self.shared is not None:
            shared = self.shared(x, ctx)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return out

    def run_masked_experts(self, packed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The experts over a masked layout (``[E, M, H]``, ``counts`` on the device): the
        fused kernels, or the FP8 ones over FP8 rows (on CUDA; elsewhere dequantized for the
        call, as ``run_fp8_experts`` does)."""
        from roundgate.kernels.moe.triton_fused_moe import masked_experts

        if self.fp8_rows is None:
            return masked_experts(packed, counts, self.w13, self.w2)
        rows13, rows2 = self.fp8_rows
        if packed.is_cuda:
            from roundgate.kernels.quant.triton_fp8_experts import masked_fp8_experts

            (w13, s13), (w2, s2) = rows13.views(self.w13), rows2.views(self.w2)
            return masked_fp8_experts(packed, counts, w13, s13, w2, s2)
        w13, w2 = dequantize_rows(self.w13, rows13, self.w2, rows2)
        return masked_experts(packed, counts, w13.to(packed.dtype), w2.to(packed.dtype))

    def run_fp8_experts(
        self, hidden: torch.Tensor, counts: list[int], experts: ExpertsKernel
    ) -> torch.Tensor:
        """The experts over their FP8 rows: on CUDA the Triton FP8 kernel (``--moe-kernel``'s
        bf16 kernels cannot read e4m3); elsewhere dequantized for this call and run by
        ``experts``, as ``Fp8Linear`` does off CUDA (tests and tools; a CPU deployment
        dequantizes once at load)."""
        rows13, rows2 = self.fp8_rows  # type: ignore[misc]
        if hidden.is_cuda:
            (w13, s13), (w2, s2) = rows13.views(self.w13), rows2.views(self.w2)
            return fp8_experts_kernel()(hidden, counts, w13, s13, w2, s2)
        w13, w2 = dequantize_rows(self.w13, rows13, self.w2, rows2)
        return experts(hidden, counts, w13.to(hidden.dtype), w2.to(hidden.dtype))

    def load(self, source: TensorSource, prefix: str) -> None:
        """Read the router, the experts of this rank's slots and the shared expert under
        ``prefix``.

        Names: Mixtral on disk (``block_sparse_moe.experts.{e}.w1/w3/w2``); Qwen/DeepSeek on
        disk (``mlp.experts.{e}.gate_proj/up_proj/down_proj``); transformers 5's fused
        in-memory names (``mlp.experts.gate_up_proj``/``down_proj``).
        """
        block = _block(source, prefix)
        fill(self.gate.weight, source, block + "gate.weight")
        if self.gate.e_score_correction_bias is not None:
            fill(self.gate.e_score_correction_bias, source, block + "gate.e_score_correction_bias")
        self.load_experts(source, prefix, range(self.w13.shape[0]))
        if self.shared is not None:
            gated = self.shared_gate is not None
            self.shared.load(source, block + ("shared_expert." if gated else "shared_experts."))
        if self.shared_gate is not None:
            fill(self.shared_gate.weight, source, block + "shared_expert_gate.weight")

    def load_experts(self, source: TensorSource, prefix: str, slots: Sequence[int]) -> None:
        """Read into ``slots`` (local) the logical experts ``expert_map`` puts there."""
        block = _block(source, prefix)
        holds = self.expert_map.local_logical
        experts = [holds[slot] for slot in slots]
        num_experts = self.expert_map.placement.num_experts
        fused = block + "experts.gate_up_proj"
        if source.has(fused):
            index = list(slots)
            total = (num_experts, *self.w13.shape[1:])
            w13, w2 = self.w13, self.w2
            w13[index] = source.get(fused, total)[experts].to(w13.device, w13.dtype)
            total = (num_experts, *w2.shape[1:])
            w2[index] = source.get(block + "experts.down_proj", total)[experts].to(
                w2.device, w2.dtype
            )
            return
        legacy = source.has(f"{block}experts.{experts[0]}.w1.weight")
        gate, up, down = ("w1", "w3", "w2") if legacy else ("gate_proj", "up_proj", "down_proj")
        inter, hidden = self.w2.shape[-1], self.w13.shape[-1]
        if self.fp8_rows is None and self.w13.shape[0] == len(slots) and len(slots):
            # The whole layer is being read: keep it FP8 if the source does and stores it so.
            probe = f"{block}experts.{experts[0]}.{gate}.weight"
            if kept_fp8(source, probe, (inter, hidden)) is not None:
                self.fp8_rows = (
                    Fp8ExpertRows.gate_up(hidden, inter),
                    Fp8ExpertRows.down(hidden, inter),
                )
                self.w13 = param_of(self.fp8_rows[0].allocate(len(slots)))
                self.w2 = param_of(self.fp8_rows[1].allocate(len(slots)))
        if self.fp8_rows is not None:
            self._load_fp8_experts(source, block, slots, experts, (gate, up, down))
            return
        for slot, expert in zip(slots, experts, strict=True):
            e = f"{block}experts.{expert}."
            fill(self.w13[slot], source, f"{e}{gate}.weight", f"{e}{up}.weight")
            fill(self.w2[slot], source, f"{e}{down}.weight")

    def _load_fp8_experts(
        self,
        source: TensorSource,
        block: str,
        slots: Sequence[int],
        experts: Sequence[int],
        names: tuple[str, str, str],
    ) -> None:
        """Read ``experts`` into FP8 ``slots`` as stored: codes and scales into each row."""
        rows13, rows2 = self.fp8_rows  # type: ignore[misc]
        inter, hidden = rows2.cols, rows2.rows
        for slot, expert in zip(slots, experts, strict=True):
            e = f"{block}experts.{expert}."
            gate = _stored(source, f"{e}{names[0]}.weight", (inter, hidden))
            up = _stored(source, f"{e}{names[1]}.weight", (inter, hidden))
            down = _stored(source, f"{e}{names[2]}.weight", (hidden, inter))
            codes = torch.cat([gate.codes.view(torch.uint8), up.codes.view(torch.uint8)])
            scales = torch.cat([gate.scale_inv, up.scale_inv])
            rows13.write(self.w13[slot], codes.view(gate.codes.dtype), scales)
            rows2.write(self.w2[slot], down.codes, down.scale_inv)


def param_of(tensor: torch.Tensor) -> nn.Parameter:
    """``tensor`` as a frozen parameter (byte rows included: they move with the module)."""
    return nn.Parameter(tensor, requires_grad=False)


def _stored(source: TensorSource, name: str, shape: tuple[int, int]) -> Fp8Tensor:
    """``name`` as stored FP8; a ``ValueError`` naming it when the checkpoint has it otherwise
    (the layer's experts are held FP8)."""
    stored = stored_fp8(source, name, shape)
    if stored is None:
        raise ValueError(
            f"{name}: this MoE layer holds its experts as FP8, but the checkpoint stores this "
            "one unquantized"
        )
    return stored


def _block(source: TensorSource, prefix: str) -> str:
    """The MoE block's name under a layer's ``prefix``: Mixtral's, else Qwen's/DeepSeek's."""
    if source.has(prefix + "block_sparse_moe.gate.weight"):
        return prefix + "block_sparse_moe."
    return prefix + "mlp."
