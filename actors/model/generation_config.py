"""A model's ``generation_config.json``: its extra stop ids and its sampling defaults.

vLLM's ``--generation-config auto`` behaviour: the defaults apply to what a request leaves
unset, never over what it says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from roundgate.actors.model.config import read_json_object

SAMPLING_KEYS = ("temperature", "top_p", "top_k")


@dataclass(frozen=True)
class GenerationConfig:
    eos_token_ids: tuple[int, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


def read_generation_config(model: str) -> GenerationConfig:
    """The directory's ``generation_config.json``, or nothing (presets, GGUF files)."""
    path = Path(model) / "generation_config.json"
    if not path.is_file():
        return GenerationConfig()
    body = read_json_object(path)
    eos = body.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in eos_ids):
        raise ValueError(f"{path}: eos_token_id must be an int or a list of ints, got {eos!r}")
    values: dict[str, float | int | None] = {}
    for key in SAMPLING_KEYS:
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{path}: {key} must be a number, got {value!r}")
        values[key] = value
    # A config that does not sample (do_sample false) sets no temperature default.
    if body.get("do_sample") is False:
        values = dict.fromkeys(SAMPLING_KEYS)
    return GenerationConfig(eos_ids, **values)  # type: ignore[arg-type]
