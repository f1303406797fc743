"""Tokenizers: byte-level for the presets, ``tokenizer.json`` (``tokenizers``) for HF dirs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from actors.model.config import BYTE_BOS_ID, BYTE_EOS_ID, PRESETS
from actors.server_args import ServerArgs


class Tokenizer(Protocol):
    """Text <-> token ids."""

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; BOS/EOS are the two ids after them.

    Every string round-trips exactly, and the vocabulary fits the presets' 512 rows.
    """

    bos_token_id = BYTE_BOS_ID
    vocab_size = 258

    @property
    def eos_token_id(self) -> int:
        return BYTE_EOS_ID

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BYTE_BOS_ID, *ids] if add_bos else ids

    def decode(self, token_ids: list[int]) -> str:
        """Special and out-of-range ids are dropped; broken UTF-8 becomes U+FFFD."""
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A model directory's ``tokenizer.json``, through the ``tokenizers`` package."""

    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer as FastTokenizer

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"{path}: missing (a HF model directory needs tokenizer.json)")
        try:
            self._tok = FastTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception subclass
            raise ValueError(f"{path}: unreadable tokenizer ({exc})") from exc
        self._eos = _find_eos(model_dir, self._tok)

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=True)


def _find_eos(model_dir: Path, tok: object) -> int | None:
    """EOS from ``config.json``'s ``eos_token_id``, else ``tokenizer_config.json``'s token."""
    for name, key in (("config.json", "eos_token_id"), ("tokenizer_config.json", "eos_token")):
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text()).get(key)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, dict):  # {"content": "</s>", ...} in older tokenizer configs
            value = value.get("content")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            return tok.token_to_id(value)  # type: ignore[attr-defined]
    return None


def load_tokenizer(args: ServerArgs | str) -> ByteTokenizer | HFTokenizer:
    """The tokenizer for ``--model``: bytes for a preset, ``tokenizer.json`` for a directory."""
    model = args if isinstance(args, str) else args.model
    if model in PRESETS:
        return ByteTokenizer()
    if not Path(model).is_dir():
        raise ValueError(
            f"--model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a local directory"
        )
    return HFTokenizer(model)
