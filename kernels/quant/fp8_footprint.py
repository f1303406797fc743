"""Weight bytes per rank of a DeepSeek-V3-style MoE model, FP8 block-scaled against bf16.

A rank of an attention-data-parallel group with expert parallelism holds every weight but the
routed experts (embeddings, attention, dense layers, shared experts, routers, norms: all
replicated) and ``1 / num_ranks`` of each MoE layer's routed experts. In DeepSeek-V3's FP8
checkpoint every linear layer of the decoder (attention projections, dense and expert MLPs) is
e4m3 with one float32 scale per 128x128 block; the embeddings, the LM head, the routers and the
norms stay 16-bit (the routers' score-correction bias float32). The multi-token-prediction
layer is not counted (the engine does not load it).
"""

from __future__ import annotations

from dataclasses import dataclass

from roundgate.kernels.quant.fp8_blocks import num_blocks


@dataclass(frozen=True)
class MoEShape:
    """The sizes that set a DeepSeek-V3-style model's weights (defaults: DeepSeek-V3, 671B)."""

    num_layers: int = 61
    num_dense_layers: int = 3  # the first layers have a dense MLP, the rest are MoE
    hidden: int = 7168
    intermediate: int = 18432  # dense MLP
    moe_intermediate: int = 2048  # one expert's MLP
    num_routed_experts: int = 256
    num_shared_experts: int = 1
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    num_heads: int = 128
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    vocab_size: int = 129280

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers

    def attention_linears(self) -> list[tuple[int, int]]:
        """``(out, in)`` of one MLA layer's projections: q_a, q_b, kv_a (with the RoPE key),
        kv_b, o."""
        qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
        return [
            (self.q_lora_rank, self.hidden),
            (self.num_heads * qk_head, self.q_lora_rank),
            (self.kv_lora_rank + self.qk_rope_head_dim, self.hidden),
            (self.num_heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank),
            (self.hidden, self.num_heads * self.v_head_dim),
        ]

    def mlp_linears(self, intermediate: int) -> list[tuple[int, int]]:
        """``(out, in)`` of a SwiGLU MLP's gate, up and down projections."""
        return [(intermediate, self.hidden)] * 2 + [(self.hidden, intermediate)]


@dataclass(frozen=True)
class RankWeights:
    """Bytes of weights one rank holds, by part."""

    routed_experts: int  # this rank's share of every MoE layer's routed experts
    replicated_linears: int  # attention, dense MLPs and shared experts: on every rank
    scales: int  # float32 block scales of all the FP8 linears above (0 in bf16)
    unquantized: int  # embeddings, LM head, routers, norms: 16-bit (a float32 bias) either way

    @property
    def total(self) -> int:
        return self.routed_experts + self.replicated_linears + self.scales + self.unquantized


def _linear_bytes(linears: list[tuple[int, int]], fp8: bool) -> tuple[int, int]:
    """(weight bytes, scale bytes) of ``linears``: one byte a weight and four a 128x128 block
    in FP8, two bytes a weight and no scales in bf16."""
    weights = sum(out * inp for out, inp in linears) * (1 if fp8 else 2)
    scales = sum(num_blocks(out) * num_blocks(inp) for out, inp in linears) * 4 if fp8 else 0
    return weights, scales


def weight_bytes_per_rank(shape: MoEShape, num_ranks: int, fp8: bool) -> RankWeights:
    """What one of ``num_ranks`` ranks holds when the routed experts are split evenly over the
    ranks and everything else is replicated, with the linears in FP8 (block-scaled) or bf16.

    Example: DeepSeek-V3 on 8 ranks holds 32 routed experts of each of its 58 MoE layers:
    ``weight_bytes_per_rank(MoEShape(), 8, fp8=True).total`` is about 100.8 GB (bf16: 197.7).
    """
    if num_ranks < 1 or shape.num_routed_experts % num_ranks:
        raise ValueError(
            f"num_ranks: {num_ranks} does not split {shape.num_routed_experts} routed experts"
        )
    expert = shape.mlp_linears(shape.moe_intermediate)
    local_experts = shape.num_moe_layers * shape.num_routed_experts // num_ranks
    routed, routed_scales = _linear_bytes(expert * local_experts, fp8)
    replicated = (
        shape.attention_linears() * shape.num_layers
        + shape.mlp_linears(shape.intermediate) * shape.num_dense_layers
        + expert * (shape.num_moe_layers * shape.num_shared_experts)
    )
    replicated_bytes, replicated_scales = _linear_bytes(replicated, fp8)
    embeddings = 2 * shape.vocab_size * shape.hidden  # input embedding and LM head
    norms = shape.num_layers * (2 * shape.hidden + shape.q_lora_rank + shape.kv_lora_rank)
    routers = shape.num_moe_layers * shape.num_routed_experts * shape.hidden
    unquantized = 2 * (embeddings + norms + shape.hidden + routers)  # + the final norm
    unquantized += 4 * shape.num_moe_layers * shape.num_routed_experts  # routers' float32 bias
    return RankWeights(routed, replicated_bytes, routed_scales + replicated_scales, unquantized)
