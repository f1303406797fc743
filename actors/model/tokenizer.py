"""Tokenizers: byte-level for the random presets, the model's own through transformers.

A real model's tokenizer and chat template come from its files, as in vLLM and SGLang:
``tokenizer.json`` / sentencepiece / the tokenizer embedded in a GGUF file, and the template from
``tokenizer_config.json``, ``chat_template.jinja``, the GGUF metadata, or ``--chat-template``.
Converting a GGUF tokenizer takes seconds, so the converted files are cached outside the
repository, keyed by the GGUF file's hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from roundgate.actors.model.config import BYTE_BOS_ID, BYTE_EOS_ID, PRESETS, ModelConfig
from roundgate.actors.model.generation_config import GenerationConfig


class ChatTemplateError(ValueError):
    """The model cannot render this chat (no template, or the template refused it)."""


class Tokenizer(Protocol):
    """Text <-> token ids, and a chat rendered the model's way."""

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatOptions | None = None,
    ) -> list[int]: ...


@dataclass(frozen=True)
class ChatOptions:
    """How a chat is rendered beyond its messages (vLLM's request fields of the same names)."""

    add_generation_prompt: bool = True  # end with the assistant's turn opened
    continue_final_message: bool = False  # leave the last (assistant) message open
    template_kwargs: tuple[tuple[str, Any], ...] = ()  # extra template variables


DEFAULT_CHAT = ChatOptions()


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; BOS/EOS are the two ids after them.

    Every string round-trips exactly, and the vocabulary fits the presets' 512 rows. The random
    presets have no chat template of their own: chat is an explicit role-tagged transcript.
    """

    bos_token_id = BYTE_BOS_ID
    vocab_size = 258

    @property
    def eos_token_id(self) -> int:
        return BYTE_EOS_ID

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BYTE_BOS_ID, *ids] if add_bos else ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Special and out-of-range ids are dropped (they have no text); broken UTF-8
        becomes U+FFFD."""
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatOptions | None = None,
    ) -> list[int]:
        if tools:
            raise ChatTemplateError("the random presets' transcript template has no tools")
        options = options or DEFAULT_CHAT
        lines = [f"<|{m['role']}|>\n{m.get('content') or ''}" for m in messages]
        text = "\n".join(lines)
        if options.add_generation_prompt:
            text += "\n<|assistant|>\n"
        elif not options.continue_final_message:
            text += "\n"
        return self.encode(text)


class HFTokenizer:
    """The model's own tokenizer and chat template, through ``transformers.AutoTokenizer``."""

    def __init__(self, tok: Any, source: str, chat_template: str | None = None) -> None:
        self._tok = tok
        self.source = source
        self.chat_template = chat_template or getattr(tok, "chat_template", None)
        self.vocab_size = len(tok)

    @property
    def eos_token_id(self) -> int | None:
        return self._tok.eos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def save_pretrained(self, directory: str) -> None:
        """Write the tokenizer as a Hugging Face directory (what external clients load)."""
        self._tok.save_pretrained(directory)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatOptions | None = None,
    ) -> list[int]:
        """``apply_chat_template`` (by default with the generation prompt); tools and the
        options' template variables go to the template."""
        options = options or DEFAULT_CHAT
        if not self.chat_template:
            raise ChatTemplateError(
                f"the model ({self.source}) has no chat template; use /v1/completions or "
                "start the server with --chat-template FILE"
            )
        try:
            out = self._tok.apply_chat_template(
                messages,
                tools=tools,
                chat_template=self.chat_template,
                add_generation_prompt=options.add_generation_prompt,
                continue_final_message=options.continue_final_message,
                tokenize=True,
                **dict(options.template_kwargs),
            )
        except Exception as exc:  # jinja2 errors, and raise_exception() inside templates
            raise ChatTemplateError(f"the chat template refused the messages: {exc}") from None
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(t) for t in ids]


def cache_dir() -> Path:
    """Where one-time conversions live (``$ROUNDGATE_CACHE``, else ``~/.cache/roundgate``)."""
    root = os.environ.get("ROUNDGATE_CACHE") or Path.home() / ".cache" / "roundgate"
    return Path(root)


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the file's SHA-256 (the conversion cache's key)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _gguf_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    cached = cache_dir() / "tokenizers" / file_digest(path)
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(str(cached))
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    tok.save_pretrained(str(tmp))
    cached.parent.mkdir(parents=True, exist_ok=True)
    # Another process may have converted it first: theirs is as good, ours is dropped.
    with contextlib.suppress(OSError):
        tmp.rename(cached)
    shutil.rmtree(tmp, ignore_errors=True)
    return tok


def _chat_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"--chat-template {path}: cannot read ({exc.strerror})") from None


def load_tokenizer(model: str, chat_template: str | None = None) -> ByteTokenizer | HFTokenizer:
    """The tokenizer for ``--model`` (``chat_template``: the ``--chat-template`` file)."""
    from roundgate.actors.model import gguf_file

    template = _chat_template(chat_template)
    if model in PRESETS:
        return ByteTokenizer()
    path = gguf_file.find_gguf(model)
    if path is not None:
        try:
            return HFTokenizer(_gguf_tokenizer(path), str(path), template)
        except Exception as exc:
            raise ValueError(f"{path}: cannot load its tokenizer ({exc})") from exc
    if not Path(model).is_dir():
        raise ValueError(f"--model {model!r}: no such directory")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model)
    except Exception as exc:  # OSError, ValueError, tokenizers' own errors
        raise ValueError(f"{model}: cannot load its tokenizer ({exc})") from exc
    return HFTokenizer(tok, model, template)


def stop_token_ids(
    config: ModelConfig, tokenizer: Tokenizer, generation: GenerationConfig
) -> tuple[int, ...]:
    """Every id that ends a generation: ``config.json`` (or GGUF) ``eos_token_id``, the
    ``generation_config.json`` one, and the tokenizer's EOS (the chat end-of-turn token)."""
    ids = [*config.eos_token_ids, *generation.eos_token_ids]
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(ids))
