"""Qwen2-MoE and Qwen3-MoE: softmax top-k experts, ``norm_topk_prob``, dense layers chosen by
``mlp_only_layers`` / ``decoder_sparse_step``; Qwen2-MoE adds a shared expert behind a
sigmoid gate, Qwen3-MoE has Qwen3's q/k norms instead of Qwen2's q/k/v biases."""

from __future__ import annotations

from typing import Any

from roundgate.actors.model.config_parts import RouterConfig
from roundgate.actors.model.families.fields import FieldReader, refuse_sliding_window


def _sparse_fields(reader: FieldReader, kwargs: dict[str, Any]) -> dict[str, Any]:
    # Qwen3-MoE's config writes num_experts as num_local_experts (an attribute_map alias).
    experts = reader.get("num_experts", int, default=None)
    if experts is None:
        experts = reader.get("num_local_experts", int)
    step = reader.get("decoder_sparse_step", int, default=1)
    if step < 1:
        raise reader.refuse("decoder_sparse_step", "must be >= 1")
    mlp_only = reader.get("mlp_only_layers", list, default=[])
    if not all(isinstance(i, int) for i in mlp_only):
        raise reader.refuse("mlp_only_layers", "a list of layer indices")
    layers = kwargs["num_layers"]
    kwargs["dense_layers"] = tuple(i for i in range(layers) if i in mlp_only or (i + 1) % step != 0)
    kwargs["num_experts"] = experts
    kwargs["top_k"] = reader.get("num_experts_per_tok", int)
    kwargs["moe_intermediate_size"] = reader.get("moe_intermediate_size", int)
    kwargs["router"] = RouterConfig(
        norm_topk_prob=reader.get("norm_topk_prob", bool, default=False)
    )
    return kwargs


def read_qwen2_moe(reader: FieldReader, kwargs: dict[str, Any]) -> dict[str, Any]:
    refuse_sliding_window(reader, switch="use_sliding_window")
    kwargs = _sparse_fields(reader, kwargs)
    kwargs["qkv_bias"] = reader.get("qkv_bias", bool, default=True)
    shared = reader.get("shared_expert_intermediate_size", int, default=0)
    kwargs["shared_expert_intermediate_size"] = shared
    kwargs["shared_expert_gate"] = shared > 0
    return kwargs


def read_qwen3_moe(reader: FieldReader, kwargs: dict[str, Any]) -> dict[str, Any]:
    refuse_sliding_window(reader, switch="use_sliding_window")
    kwargs = _sparse_fields(reader, kwargs)
    kwargs["attention_bias"] = reader.get("attention_bias", bool, default=False)
    kwargs["qk_norm"] = True
    return kwargs
