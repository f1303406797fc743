"""Llama and Mixtral: the families the engine started with (GQA, SwiGLU, softmax top-k)."""

from __future__ import annotations

from typing import Any

from roundgate.actors.model.families.fields import FieldReader, refuse_sliding_window


def read_llama(reader: FieldReader, kwargs: dict[str, Any]) -> dict[str, Any]:
    refuse_sliding_window(reader, switch=None)
    kwargs["attention_bias"] = reader.get("attention_bias", bool, default=False)
    kwargs["mlp_bias"] = reader.get("mlp_bias", bool, default=False)
    return kwargs


def read_mixtral(reader: FieldReader, kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = read_llama(reader, kwargs)
    kwargs["num_experts"] = reader.get("num_local_experts", int)
    kwargs["top_k"] = reader.get("num_experts_per_tok", int)
    kwargs["moe_intermediate_size"] = kwargs["intermediate_size"]
    kwargs["intermediate_size"] = 0
    return kwargs
