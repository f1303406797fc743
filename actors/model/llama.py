"""The decoder (Llama, or Mixtral when the config has experts) and its HF-name weight loader."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from actors.model.config import ModelConfig
from actors.model.layers import Attention, DenseMLP, ForwardContext, RMSNorm, RotaryTable, SparseMoE
from actors.model.weights import TensorSource, hf_param_shapes
from kernels.moe import ExpertPlacement, MoEBackend


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``h + mlp(norm(h))``."""

    def __init__(self, config: ModelConfig, layer: int, num_local_experts: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: DenseMLP | SparseMoE = (
            SparseMoE(config, num_local_experts) if config.is_moe else DenseMLP(config)
        )

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), ctx)
        return h + self.mlp(self.post_attention_layernorm(h), ctx)


class CausalLM(nn.Module):
    """Token ids in, next-token logits out, for the rows the caller asks for."""

    def __init__(self, config: ModelConfig, placement: ExpertPlacement | None = None) -> None:
        super().__init__()
        self.config = config
        self.placement = placement or ExpertPlacement(max(config.num_experts, 1))
        local = self.placement.num_local_experts if config.is_moe else 0
        self.embed_tokens = torch.nn.utils.skip_init(
            nn.Embedding, config.vocab_size, config.hidden_size
        ).requires_grad_(False)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, local) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = torch.nn.utils.skip_init(
            nn.Linear, config.hidden_size, config.vocab_size, bias=False
        ).requires_grad_(False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryTable(config.head_dim, config.max_position, config.rope_theta)

    def forward(
        self, input_ids: torch.Tensor, ctx: ForwardContext, logit_rows: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states for every token; logits only at ``logit_rows`` (``[B, vocab]``)."""
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h, ctx)
        return self.lm_head(self.norm(h.index_select(0, logit_rows)))

    def idle_forward(self, moe: MoEBackend | None, low_latency: bool) -> None:
        """Join every MoE layer's collectives with zero tokens (a rank with nothing to run).

        Layers are visited in the same order as a real forward, so the collectives pair up
        with the busy ranks' ones.
        """
        if not self.config.is_moe or moe is None or not moe.needs_collectives:
            return
        empty = self.embed_tokens.weight.new_zeros(0, self.config.hidden_size)
        for layer in self.layers:
            layer.mlp.run(empty, moe, low_latency)


@torch.no_grad()
def load_weights(model: CausalLM, source: TensorSource) -> None:
    """Copy HF-named tensors into the fused layout; only this rank's experts are read.

    Reads both Mixtral naming schemes: the per-expert checkpoint names
    (``block_sparse_moe.experts.{e}.w1/w2/w3``) and transformers 5's fused in-memory names
    (``mlp.experts.gate_up_proj``/``down_proj``, router ``mlp.gate``).
    """
    config = model.config
    shapes = hf_param_shapes(config)

    def get(name: str) -> torch.Tensor:
        return source.get(name, shapes[name])

    model.embed_tokens.weight.copy_(get("model.embed_tokens.weight"))
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        attn = layer.self_attn
        attn.qkv_proj.weight.copy_(
            torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")])
        )
        attn.o_proj.weight.copy_(get(p + "self_attn.o_proj.weight"))
        if config.attention_bias:
            attn.qkv_proj.bias.copy_(
                torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in ("q", "k", "v")])
            )
            attn.o_proj.bias.copy_(get(p + "self_attn.o_proj.bias"))
        layer.input_layernorm.weight.copy_(get(p + "input_layernorm.weight"))
        layer.post_attention_layernorm.weight.copy_(get(p + "post_attention_layernorm.weight"))
        if config.is_moe:
            _load_experts(layer.mlp, source, p, model.placement, config, get)
        else:
            mlp = layer.mlp
            mlp.gate_up_proj.weight.copy_(
                torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
            )
            mlp.down_proj.weight.copy_(get(p + "mlp.down_proj.weight"))
            if config.mlp_bias:
                mlp.gate_up_proj.bias.copy_(
                    torch.cat([get(p + "mlp.gate_proj.bias"), get(p + "mlp.up_proj.bias")])
                )
                mlp.down_proj.bias.copy_(get(p + "mlp.down_proj.bias"))
    model.norm.weight.copy_(get("model.norm.weight"))
    if not config.tie_word_embeddings:
        model.lm_head.weight.copy_(get("lm_head.weight"))


def _load_experts(
    mlp: SparseMoE,
    source: TensorSource,
    prefix: str,
    placement: ExpertPlacement,
    config: ModelConfig,
    get: Callable[[str], torch.Tensor],
) -> None:
    experts = list(placement.local_experts)
    fused = prefix + "mlp.experts.gate_up_proj"
    if source.has(fused):
        e, h, inter = config.num_experts, config.hidden_size, config.moe_intermediate_size
        mlp.gate.weight.copy_(source.get(prefix + "mlp.gate.weight", (e, h)))
        mlp.w13.copy_(source.get(fused, (e, 2 * inter, h))[experts])
        mlp.w2.copy_(source.get(prefix + "mlp.experts.down_proj", (e, h, inter))[experts])
        return
    moe = prefix + "block_sparse_moe."
    mlp.gate.weight.copy_(get(moe + "gate.weight"))
    for local, expert in enumerate(experts):
        e = f"{moe}experts.{expert}."
        mlp.w13[local].copy_(torch.cat([get(e + "w1.weight"), get(e + "w3.weight")]))
        mlp.w2[local].copy_(get(e + "w2.weight"))


def build_model(
    config: ModelConfig,
    source: TensorSource,
    placement: ExpertPlacement | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> CausalLM:
    """Construct on CPU, load, then move once; the RoPE tables are rebuilt in float32 on
    the device (casting them through bf16 would round the angles)."""
    model = CausalLM(config, placement)
    load_weights(model, source)
    model.to(device=device, dtype=dtype)
    model.rotary = RotaryTable(config.head_dim, config.max_position, config.rope_theta).to(device)
    return model.eval()
