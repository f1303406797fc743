"""Qwen2: Llama's decoder with biases on q/k/v (none on o_proj)."""

from __future__ import annotations

from typing import Any

from roundgate.actors.model.families.fields import FieldReader, refuse_sliding_window


def read_config(reader: FieldReader, kwargs: dict[str, Any]) -> dict[str, Any]:
    refuse_sliding_window(reader, switch="use_sliding_window")
    kwargs["qkv_bias"] = True  # transformers' Qwen2Attention always has them
    return kwargs
