"""Tiny random models of every family the engine loads, built with transformers' own classes.

Each builder returns an ``eval()`` model with seeded weights; the test saves it with
``save_pretrained`` and compares the engine with it. Shapes are small enough for milliseconds
per forward yet exercise each family's switches: GQA, q/k/v biases, q/k norms with an
explicit ``head_dim``, shared experts, dense layers among sparse ones, MLA with and without
q-LoRA, YaRN, grouped routing with a random ``e_score_correction_bias``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from model_driver import HF_SHAPE

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "beta_fast": 32,
    "beta_slow": 1,
}
MLA_SHAPE = {
    **HF_SHAPE,
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,  # MLA expands K/V to every head
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 12,
    "v_head_dim": 10,
    "moe_intermediate_size": 32,
    "num_experts_per_tok": 2,
    "n_routed_experts": 8,
}
MOE_SHAPE = {**HF_SHAPE, "num_hidden_layers": 3, "moe_intermediate_size": 32, "num_experts": 4}


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**HF_SHAPE))


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**HF_SHAPE, head_dim=24))


def _qwen2_moe():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(
        **MOE_SHAPE, num_experts_per_tok=2, shared_expert_intermediate_size=48, mlp_only_layers=[1]
    )
    return Qwen2MoeForCausalLM(config)


def _qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    # decoder_sparse_step 2 makes layers 1 and 3 sparse, mlp_only_layers takes layer 3 back:
    # one sparse layer between dense ones.
    config = Qwen3MoeConfig(
        **{**MOE_SHAPE, "num_hidden_layers": 4},
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
    )
    return Qwen3MoeForCausalLM(config)


def deepseek_v3(**shape: int) -> torch.nn.Module:
    """The DeepSeek-V3 family's model; ``shape`` overrides ``MLA_SHAPE``'s sizes."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        **{**MLA_SHAPE, **shape},
        q_lora_rank=24,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        rope_parameters=YARN,
    )
    model = DeepseekV3ForCausalLM(config)
    with torch.no_grad():  # zero at init; random so the choice depends on it
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.5)
    return model


def _deepseek_v2():
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    config = DeepseekV2Config(
        **MLA_SHAPE,
        q_lora_rank=None,
        n_group=4,
        topk_group=2,
        topk_method="group_limited_greedy",
        first_k_dense_replace=0,
        n_shared_experts=2,
        routed_scaling_factor=1.5,
    )
    return DeepseekV2ForCausalLM(config)


FAMILIES: dict[str, Callable[[], torch.nn.Module]] = {
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v3": deepseek_v3,
    "deepseek_v2": _deepseek_v2,
}


def build_family(name: str, seed: int = 0) -> torch.nn.Module:
    """A seeded random model of family ``name``, in eval mode."""
    torch.manual_seed(seed)
    return FAMILIES[name]().eval()
