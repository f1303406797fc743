"""Typed reading of a ``config.json`` body, and the fields every decoder family shares.

Every refusal names the file and the field, and happens while the config is read, i.e. in
``build_app`` (``ServerArgs`` resolves the model once there), before any replica starts.
"""

from __future__ import annotations

from typing import Any

from roundgate.actors.model.config_parts import RopeScaling


class FieldReader:
    """Typed access to a config body, with errors naming the file and the field."""

    _MISSING = object()

    def __init__(self, body: dict[str, Any], source: str) -> None:
        self.body = body
        self.source = source

    def get(self, name: str, kind: type, default: Any = _MISSING) -> Any:
        if name not in self.body or self.body[name] is None:
            if default is self._MISSING:
                raise ValueError(f"{self.source}: required field {name!r} is missing")
            return default
        value = self.body[name]
        if kind is object:
            return value
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if (kind is not bool and isinstance(value, bool)) or not isinstance(value, kind):
            raise ValueError(
                f"{self.source}: field {name!r} must be {kind.__name__}, got {value!r}"
            )
        return value

    def refuse(self, name: str, why: str) -> ValueError:
        return ValueError(f"{self.source}: {name} {self.body.get(name)!r} is not supported ({why})")

    def require(self, name: str, allowed: tuple[Any, ...], default: Any) -> Any:
        """A field whose value must be one of ``allowed`` (absent reads as ``default``)."""
        value = self.body.get(name, default)
        if value is None:
            value = default
        if value not in allowed:
            raise self.refuse(name, f"supported: {', '.join(map(repr, allowed))}")
        return value


def common_fields(reader: FieldReader) -> dict[str, Any]:
    """The ``ModelConfig`` keywords every family reads the same way (Llama's names)."""
    reader.require("hidden_act", ("silu",), "silu")
    if reader.get("pretraining_tp", int, default=1) != 1:
        raise reader.refuse("pretraining_tp", "only 1")
    hidden = reader.get("hidden_size", int)
    heads = reader.get("num_attention_heads", int)
    eos = reader.get("eos_token_id", object, default=None)
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    theta, scaling = rope_fields(reader)
    return {
        "vocab_size": reader.get("vocab_size", int),
        "hidden_size": hidden,
        "num_layers": reader.get("num_hidden_layers", int),
        "num_heads": heads,
        "num_kv_heads": reader.get("num_key_value_heads", int, default=heads),
        "head_dim": reader.get("head_dim", int, default=None) or hidden // heads,
        "intermediate_size": reader.get("intermediate_size", int, default=0),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rms_norm_eps": reader.get("rms_norm_eps", float, default=1e-6),
        "max_position": reader.get("max_position_embeddings", int, default=4096),
        "tie_word_embeddings": reader.get("tie_word_embeddings", bool, default=False),
        "bos_token_id": reader.get("bos_token_id", int, default=None),
        "eos_token_ids": eos_ids,
    }


def refuse_sliding_window(reader: FieldReader, *, switch: str | None) -> None:
    """Sliding-window attention is not implemented: refuse it wherever the family turns it on
    (``switch`` names the family's on/off flag, e.g. Qwen's ``use_sliding_window``)."""
    if switch is not None:
        if reader.get(switch, bool, default=False):
            raise reader.refuse(switch, "sliding-window attention is not implemented")
    elif reader.get("sliding_window", object, default=None) is not None:
        raise reader.refuse("sliding_window", "sliding-window attention is not implemented")
    layer_types = reader.get("layer_types", list, default=None) or []
    if any(kind != "full_attention" for kind in layer_types):
        raise reader.refuse("layer_types", "only full_attention layers")


def rope_fields(reader: FieldReader) -> tuple[float, RopeScaling]:
    """``(rope_theta, scaling)`` from transformers 5's ``rope_parameters`` or 4.x's
    ``rope_theta``/``rope_scaling``; a type other than default/llama3/yarn is refused."""
    params = reader.get("rope_parameters", dict, default=None)
    legacy = reader.get("rope_scaling", dict, default=None)
    block, name = (params, "rope_parameters") if params is not None else (legacy, "rope_scaling")
    theta = reader.get("rope_theta", float, default=10000.0)
    if block is None:
        return theta, RopeScaling()
    theta = float(block.get("rope_theta", theta))
    kind = block.get("rope_type", block.get("type", "default"))
    if kind not in ("default", "llama3", "yarn"):
        raise ValueError(
            f"{reader.source}: {name} type {kind!r} is not supported (default, llama3, yarn)"
        )
    if kind == "default":
        return theta, RopeScaling()
    original = block.get("original_max_position_embeddings")
    factor = block.get("factor")
    if factor is None and kind == "yarn" and original:  # transformers' DeepSeek-V3 reading
        factor = reader.get("max_position_embeddings", int) / original
    try:
        return theta, RopeScaling(
            kind=kind,
            factor=float(factor if factor is not None else 1.0),
            original_max_position=int(original or 0),
            low_freq_factor=float(block.get("low_freq_factor", 1.0)),
            high_freq_factor=float(block.get("high_freq_factor", 4.0)),
            beta_fast=float(block.get("beta_fast") or 32.0),
            beta_slow=float(block.get("beta_slow") or 1.0),
            mscale=float(block.get("mscale") or 0.0),
            mscale_all_dim=float(block.get("mscale_all_dim") or 0.0),
            attention_factor=block.get("attention_factor"),
            truncate=bool(block.get("truncate", True)),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{reader.source}: {name}: {exc}") from exc
