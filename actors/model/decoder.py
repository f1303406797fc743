"""The decoder every family shares: embeddings, pre-norm blocks, final norm, LM head.

A block's attention is GQA (``layers.Attention``) or latent (``mla.MLAttention``); its MLP is
SwiGLU (``layers.DenseMLP``) or sparse (``moe.SparseMoE``), per layer as the config says.
Each module loads its own HF-named tensors, so a family differs only in its config reader;
``open_source`` picks the reader of those tensors for ``--model`` (preset, GGUF, safetensors).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from roundgate.actors.model.config import PRESETS, ModelConfig
from roundgate.actors.model.fp8 import BlockFP8Source
from roundgate.actors.model.gguf_file import find_gguf
from roundgate.actors.model.gguf_source import GGUFSource
from roundgate.actors.model.layers import Attention, DenseMLP, ForwardContext, RMSNorm, fill
from roundgate.actors.model.llamacpp_arith import FusedDecoder
from roundgate.actors.model.mla import MLAttention
from roundgate.actors.model.moe import Router, SparseMoE
from roundgate.actors.model.rope import RotaryTable
from roundgate.actors.model.weights import (
    DictSource,
    ReadTracker,
    SafetensorsSource,
    TensorSource,
    random_hf_state,
    unread_tensors,
)
from roundgate.kernels.moe.base import MoEBackend
from roundgate.kernels.moe.eplb import Placement
from roundgate.kernels.moe.expert_map import ExpertMap
from roundgate.kernels.moe.placement import ExpertPlacement


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``h + mlp(norm(h))``."""

    def __init__(
        self, config: ModelConfig, layer: int, placement: ExpertPlacement, moe_index: int
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn: Attention | MLAttention = (
            MLAttention(config, layer) if config.mla else Attention(config, layer)
        )
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: DenseMLP | SparseMoE = (
            SparseMoE(config, placement, moe_index)
            if config.is_moe_layer(layer)
            else DenseMLP(config.hidden_size, config.intermediate_size, config.mlp_bias)
        )

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        kernels = ctx.fused
        if kernels is None:
            h = x + self.self_attn(self.input_layernorm(x), ctx)
            return h + self.mlp(self.post_attention_layernorm(h), ctx)
        # The fused path: each norm one launch, the residual add folded into the second
        # (``kernels/fused/triton_norm``): the arithmetic above, in fewer ops.
        first, second = self.input_layernorm, self.post_attention_layernorm
        attended = self.self_attn(kernels.rms_norm(x, first.weight, first.eps), ctx)
        normed, h = kernels.add_rms_norm(attended, x, second.weight, second.eps)
        return h + self.mlp(normed, ctx)


class CausalLM(nn.Module):
    """Token ids in, next-token logits out, for the rows the caller asks for."""

    def __init__(
        self,
        config: ModelConfig,
        placement: ExpertPlacement | None = None,
        expert_maps: Sequence[Placement] | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.placement = placement or ExpertPlacement(max(config.num_experts, 1))
        moe_layers = [i for i in range(config.num_layers) if config.is_moe_layer(i)]
        # Given its (uninitialised) weight, not ``skip_init``: that builds the module on the
        # meta device, whose ``normal_`` goes through torch's compiler stack and imports
        # triton on the CPU path.
        weight = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*weight.shape, _weight=weight, _freeze=True)
        moe_index = {layer: index for index, layer in enumerate(moe_layers)}
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, self.placement, moe_index.get(i, -1))
            for i in range(config.num_layers)
        )
        if expert_maps is not None:  # a placement file's (checked already)
            for layer, physical in zip(self.moe_layers(), expert_maps, strict=True):
                layer.expert_map = ExpertMap(self.placement, physical)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = torch.nn.utils.skip_init(
            nn.Linear, config.hidden_size, config.vocab_size, bias=False
        ).requires_grad_(False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = rotary_table(config)
        # Every layer in one call (``llamacpp_arith.FusedDecoder``: packed CPU weights), or None.
        self.fused: FusedDecoder | None = None

    def forward(
        self, input_ids: torch.Tensor, ctx: ForwardContext, logit_rows: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states for every token; logits only at ``logit_rows`` (``[B, vocab]``)."""
        return self.lm_head(self.norm(self.trunk(input_ids, ctx).index_select(0, logit_rows)))

    def trunk(self, input_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Every token's last hidden state, before the final norm."""
        h = self.embed_tokens(input_ids)
        if self.fused is not None and self.fused.takes(h.shape[0]):
            return self.fused(h, ctx)
        for layer in self.layers:
            h = layer(h, ctx)
        return h

    def forward_hidden(
        self, input_ids: torch.Tensor, ctx: ForwardContext, logit_rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward``'s logits and every token's normed hidden state (what a next-n layer
        drafts from: ``roundgate.actors.model.mtp``)."""
        hidden = self.norm(self.trunk(input_ids, ctx))
        return self.lm_head(hidden.index_select(0, logit_rows)), hidden

    def moe_layers(self) -> list[SparseMoE]:
        """The sparse blocks, in layer order (``moe_index`` order)."""
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, SparseMoE)]

    def idle_forward(self, moe: MoEBackend | None, low_latency: bool) -> None:
        """Join every MoE layer's collectives with zero tokens (a rank with nothing to run).

        Sparse layers are visited in the same order as a real forward, so the collectives
        pair up with the busy ranks' ones; dense layers have none.
        """
        if not self.config.is_moe or moe is None or not moe.needs_collectives:
            return
        empty = self.embed_tokens.weight.new_zeros(0, self.config.hidden_size)
        for layer in self.layers:
            if isinstance(layer.mlp, SparseMoE):
                layer.mlp.run(empty, moe, low_latency)


def rotary_table(config: ModelConfig) -> RotaryTable:
    return RotaryTable(config.rope_dim, config.max_position, config.rope_theta, config.rope_scaling)


def open_source(
    model: str,
    config: ModelConfig,
    seed: int,
    fp8_weights: str = "auto",
    device: torch.device | str | None = None,
) -> TensorSource:
    """The weights behind ``--model``: a seeded preset, a GGUF file, or safetensors (FP8
    block-scaled ones dequantized as they are read, or kept FP8: ``--fp8-weights``; ``auto``
    is decided for ``device``, or by ``build_model`` for its own when no device is given)."""
    if model in PRESETS:
        return DictSource(random_hf_state(config, seed), f"preset {model}")
    path = find_gguf(model)
    if path is not None:
        return GGUFSource(path, config)
    source = SafetensorsSource(model)
    if config.weight_block_size is not None:
        fp8 = BlockFP8Source(source, config.weight_block_size, fp8_weights)
        return fp8 if device is None else fp8.for_device(device)
    return source


@torch.no_grad()
def load_weights(model: CausalLM, source: TensorSource) -> None:
    """Copy HF-named tensors into the fused layout; only this rank's experts are read.

    A checkpoint that lists its names (safetensors) must have none left unread: a tensor
    the architecture has no place for means the config does not describe these weights.
    """
    tracker = ReadTracker(source)
    _load_all(model, tracker)
    names = getattr(getattr(source, "inner", source), "names", None)
    if names is not None:
        unread = unread_tensors(names(), tracker.read, model.config.num_layers)
        if unread:
            raise ValueError(
                f"checkpoint tensor {unread[0]!r} (and {len(unread) - 1} more) is not part of "
                f"{model.config.architecture} as config.json describes it: a mislabelled "
                "architecture or an unsupported variant"
            )


def _load_all(model: CausalLM, source: TensorSource) -> None:
    config = model.config
    fill(model.embed_tokens.weight, source, "model.embed_tokens.weight")
    for i, layer in enumerate(model.layers):
        load_layer(layer, source, f"model.layers.{i}.")
    fill(model.norm.weight, source, "model.norm.weight")
    if not config.tie_word_embeddings:
        fill(model.lm_head.weight, source, "lm_head.weight")


def load_layer(layer: DecoderLayer, source: TensorSource, prefix: str) -> None:
    """One block's HF-named tensors under ``prefix`` (``model.layers.{i}.``)."""
    layer.self_attn.load(source, prefix + "self_attn.")
    fill(layer.input_layernorm.weight, source, prefix + "input_layernorm.weight")
    fill(layer.post_attention_layernorm.weight, source, prefix + "post_attention_layernorm.weight")
    if isinstance(layer.mlp, SparseMoE):
        layer.mlp.load(source, prefix)
    else:
        layer.mlp.load(source, prefix + "mlp.")


def move_to(module: nn.Module, dtype: torch.dtype, device: torch.device | str) -> None:
    """Move ``module`` once, its routers kept float32 (transformers keeps DeepSeek's that
    way): expert choice is a top-k over close scores, and rounding them to bf16 would change
    which experts run."""
    routers = [m for m in module.modules() if isinstance(m, Router)]
    kept = [{n: p.detach().clone() for n, p in m.named_parameters()} for m in routers]
    module.to(device=device, dtype=dtype)
    for router, params in zip(routers, kept, strict=True):
        for name, value in params.items():
            setattr(router, name, nn.Parameter(value.to(device), requires_grad=False))


def build_model(
    config: ModelConfig,
    source: TensorSource,
    placement: ExpertPlacement | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    expert_maps: Sequence[Placement] | None = None,
) -> CausalLM:
    """Construct on CPU, load, then move once; the RoPE tables are rebuilt in float32 on
    the device (casting them through bf16 would round the angles) and routers kept float32.
    ``expert_maps``: each MoE layer's physical -> logical placement (default: the static
    blocks). An FP8 checkpoint's ``--fp8-weights auto`` is decided here, for ``device``: kept
    FP8 on CUDA (``Fp8Linear``, FP8 expert rows), dequantized elsewhere."""
    model = CausalLM(config, placement, expert_maps)
    if isinstance(source, BlockFP8Source):  # --fp8-weights auto: keep FP8 on CUDA
        source = source.for_device(device)
    load_weights(model, source)
    move_to(model, dtype, device)
    model.rotary = rotary_table(config).to(device)
    for moe in model.moe_layers():  # the routing tables beside the weights
        moe.expert_map = ExpertMap(model.placement, moe.expert_map.physical_to_logical, device)
    return model.eval()
