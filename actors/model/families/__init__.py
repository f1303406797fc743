"""HF architectures the engine implements, one reader module per family.

``read_hf_config`` turns a ``config.json`` body into a ``ModelConfig`` or refuses it naming
the architecture or the field (``read_model_dir`` reads the file); ``ServerArgs`` calls it once
in ``build_app``, so a model the engine cannot run never reaches a replica. Adding a family is
one module here plus one line in ``ARCHITECTURES`` (its layers come from
``actors/model/layers.py``, ``mla.py``, ``moe.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from roundgate.actors.model.config import ModelConfig, read_json_object
from roundgate.actors.model.families import deepseek, llama, qwen2, qwen3, qwen_moe
from roundgate.actors.model.families.fields import FieldReader, common_fields

ARCHITECTURES: dict[str, Callable[[FieldReader, dict[str, Any]], dict[str, Any]]] = {
    "LlamaForCausalLM": llama.read_llama,
    "MixtralForCausalLM": llama.read_mixtral,
    "Qwen2ForCausalLM": qwen2.read_config,
    "Qwen3ForCausalLM": qwen3.read_config,
    "Qwen2MoeForCausalLM": qwen_moe.read_qwen2_moe,
    "Qwen3MoeForCausalLM": qwen_moe.read_qwen3_moe,
    "DeepseekV2ForCausalLM": deepseek.read_v2,
    "DeepseekV3ForCausalLM": deepseek.read_v3,
}


def read_hf_config(body: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """A ``ModelConfig`` from a transformers ``config.json`` body (errors name the field)."""
    reader = FieldReader(body, source)
    archs = reader.get("architectures", list)
    known = [a for a in archs if a in ARCHITECTURES]
    if not known:
        raise ValueError(
            f"{source}: architectures {archs} has none of the supported {sorted(ARCHITECTURES)}"
        )
    kwargs = common_fields(reader)
    kwargs["weight_block_size"] = _quantization(reader)
    kwargs = ARCHITECTURES[known[0]](reader, kwargs)
    try:
        return ModelConfig(architecture=known[0], **kwargs)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from exc


def read_model_dir(model_dir: str | Path) -> ModelConfig:
    """Read ``<model_dir>/config.json``; errors name the missing or malformed file."""
    path = Path(model_dir) / "config.json"
    if not Path(model_dir).is_dir():
        raise ValueError(f"model directory {model_dir} does not exist")
    if not path.is_file():
        raise ValueError(f"{path}: missing (a HF model directory needs config.json)")
    return read_hf_config(read_json_object(path), source=str(path))


def _quantization(reader: FieldReader) -> tuple[int, int] | None:
    """``quantization_config``: FP8 block scales (DeepSeek-V3's format) are dequantized at
    load; any other method is refused by name rather than loaded as garbage."""
    quant = reader.get("quantization_config", dict, default=None)
    if quant is None:
        return None
    method = quant.get("quant_method")
    if method != "fp8":
        raise ValueError(
            f"{reader.source}: quantization_config quant_method {method!r} is not supported "
            "(only 'fp8' with block scales, dequantized at load)"
        )
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"{reader.source}: quantization_config fmt {fmt!r} is not supported")
    block = quant.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) for b in block)):
        raise ValueError(
            f"{reader.source}: quantization_config weight_block_size must be [rows, cols], "
            f"got {block!r} (per-tensor FP8 is not supported)"
        )
    return (block[0], block[1])
