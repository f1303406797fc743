"""``--model`` to its ``ModelConfig``: the one place that knows every kind of model source."""

from __future__ import annotations

from pathlib import Path

from roundgate.actors.model import gguf_file
from roundgate.actors.model.config import PRESETS, ModelConfig
from roundgate.actors.model.families import read_model_dir


def resolve_model_config(model: str) -> ModelConfig:
    """A random preset by name; a GGUF model (a packaged preset, a ``.gguf`` file or a
    directory holding one); or the ``config.json`` of a local HF directory."""
    if model in PRESETS:
        return PRESETS[model]
    if model not in gguf_file.PACKAGED and not Path(model).exists():
        names = ", ".join([*PRESETS, *gguf_file.PACKAGED])
        raise ValueError(
            f"--model {model!r} is neither a preset ({names}) nor a local directory or .gguf file"
        )
    path = gguf_file.find_gguf(model)
    if path is not None:
        return gguf_file.read_config(path)
    return read_model_dir(model)
