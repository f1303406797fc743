"""Qwen3: no q/k/v biases but a per-head RMSNorm on q and k, and an explicit ``head_dim``."""

from __future__ import annotations

from typing import Any

from roundgate.actors.model.families.fields import FieldReader, refuse_sliding_window


def read_config(reader: FieldReader, kwargs: dict[str, Any]) -> dict[str, Any]:
    refuse_sliding_window(reader, switch="use_sliding_window")
    # head_dim is part of Qwen3's shape (128 with hidden 4096 / 32 heads or not); its config
    # class defaults it, so a body without it means transformers' default.
    kwargs["head_dim"] = reader.get("head_dim", int, default=128)
    kwargs["attention_bias"] = reader.get("attention_bias", bool, default=False)
    kwargs["qk_norm"] = True
    return kwargs
