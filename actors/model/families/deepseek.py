"""DeepSeek-V2 and -V3: MLA attention, a dense prefix of ``first_k_dense_replace`` layers,
shared experts, and their routers (V2: softmax, greedy or group-limited; V3: sigmoid with
``e_score_correction_bias`` and grouped choice), scaled by ``routed_scaling_factor``."""

from __future__ import annotations

from typing import Any

from roundgate.actors.model.config_parts import MLAConfig, RouterConfig
from roundgate.actors.model.families.fields import FieldReader


def _mla(reader: FieldReader, interleave: bool) -> MLAConfig:
    q_lora = reader.body.get("q_lora_rank")
    if q_lora is not None and (not isinstance(q_lora, int) or isinstance(q_lora, bool)):
        raise reader.refuse("q_lora_rank", "an integer or null")
    return MLAConfig(
        q_lora_rank=q_lora,
        kv_lora_rank=reader.get("kv_lora_rank", int),
        qk_nope_head_dim=reader.get("qk_nope_head_dim", int),
        qk_rope_head_dim=reader.get("qk_rope_head_dim", int),
        v_head_dim=reader.get("v_head_dim", int),
        rope_interleave=interleave,
    )


def _common(reader: FieldReader, kwargs: dict[str, Any], mla: MLAConfig, dense: int) -> None:
    if reader.get("attention_bias", bool, default=False):
        raise reader.refuse("attention_bias", "DeepSeek checkpoints have no attention biases")
    if reader.get("moe_layer_freq", int, default=1) != 1:
        raise reader.refuse("moe_layer_freq", "only 1")
    layers = kwargs["num_layers"]
    first_dense = reader.get("first_k_dense_replace", int, default=dense)
    kwargs["mla"] = mla
    kwargs["head_dim"] = mla.qk_head_dim
    kwargs["num_kv_heads"] = kwargs["num_heads"]  # MLA expands K/V to every head
    kwargs["dense_layers"] = tuple(range(min(first_dense, layers)))
    kwargs["num_experts"] = reader.get("n_routed_experts", int)
    kwargs["top_k"] = reader.get("num_experts_per_tok", int)
    inter = reader.get("moe_intermediate_size", int)
    kwargs["moe_intermediate_size"] = inter


def read_v2(reader: FieldReader, kwargs: dict[str, Any]) -> dict[str, Any]:
    _common(reader, kwargs, _mla(reader, interleave=True), dense=0)
    reader.require("scoring_func", ("softmax",), "softmax")
    method = reader.require("topk_method", ("greedy", "group_limited_greedy"), "greedy")
    # transformers' DeepseekV2 router never renormalises while DeepSeek's own code does when
    # this is true: refused rather than silently matching one of them.
    reader.require("norm_topk_prob", (False,), False)
    grouped = method == "group_limited_greedy"
    kwargs["shared_expert_intermediate_size"] = kwargs["moe_intermediate_size"] * reader.get(
        "n_shared_experts", int, default=2
    )
    kwargs["router"] = RouterConfig(
        scoring="softmax",
        topk_method=method,
        norm_topk_prob=False,
        n_group=reader.get("n_group", int) if grouped else 1,
        topk_group=reader.get("topk_group", int) if grouped else 1,
        routed_scaling_factor=reader.get("routed_scaling_factor", float, default=1.0),
    )
    return kwargs


def read_v3(reader: FieldReader, kwargs: dict[str, Any]) -> dict[str, Any]:
    interleave = reader.get("rope_interleave", bool, default=True)
    _common(reader, kwargs, _mla(reader, interleave), dense=3)
    # The multi-token-prediction layer(s) stored after the model's (``speculative_config``
    # method ``mtp`` drafts with them).
    kwargs["num_nextn_predict_layers"] = reader.get("num_nextn_predict_layers", int, default=0)
    reader.require("scoring_func", ("sigmoid",), "sigmoid")
    reader.require("topk_method", ("noaux_tc",), "noaux_tc")
    kwargs["shared_expert_intermediate_size"] = kwargs["moe_intermediate_size"] * reader.get(
        "n_shared_experts", int, default=1
    )
    kwargs["router"] = RouterConfig(
        scoring="sigmoid",
        topk_method="noaux_tc",
        norm_topk_prob=reader.get("norm_topk_prob", bool, default=True),
        n_group=reader.get("n_group", int, default=8),
        topk_group=reader.get("topk_group", int, default=4),
        routed_scaling_factor=reader.get("routed_scaling_factor", float, default=2.5),
    )
    return kwargs
