"""``/tokenize``, ``/detokenize`` and ``/tokenizer_info`` in vLLM's shapes.

``/tokenize`` takes a ``prompt`` (as ``/v1/completions`` would tokenize it) or chat
``messages`` (rendered by the model's template as ``/v1/chat/completions`` would, with the
same ``add_generation_prompt``, ``continue_final_message`` and ``chat_template_kwargs``), and
answers ``{count, max_model_len, tokens, token_strs}``; ``token_strs`` are each token's
vocabulary piece, as vLLM's (``convert_ids_to_tokens``). ``/detokenize`` answers
``{prompt}``. ``/tokenizer_info`` is the tokenizer's configuration (its ``init_kwargs`` as
JSON, its class and the chat template), which clients such as lm-evaluation-harness read
instead of downloading the tokenizer.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.chat import chat_options, chat_prompt_ids
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.protocol import ChatMessage, ChatRequest, Int, check_tools, parse


class TokenizeRequest(BaseModel):
    """``/tokenize``: exactly one of ``prompt`` and ``messages``."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = Field(True, description="prompt only: BOS/EOS as the model adds")
    add_generation_prompt: bool = Field(True, description="messages only")
    continue_final_message: bool = Field(False, description="messages only")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="messages only")
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False

    _tools = field_validator("tools")(check_tools)


class DetokenizeRequest(BaseModel):
    """``/detokenize``: token ids to text."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[Int]


async def tokenize_route(core: Ingress, request: Request) -> dict[str, Any]:
    """The ``/tokenize`` route's body, rendered and tokenized on a prepare thread (off the
    loop that drives this replica's streams: ``roundgate.deployment.openai.prepare``)."""
    req = await core.read_request(request, TokenizeRequest)
    return await core.prepare.run(tokenize, core, req)


async def detokenize_route(core: Ingress, request: Request) -> dict[str, Any]:
    """The ``/detokenize`` route's body, decoded on a prepare thread."""
    req = await core.read_request(request, DetokenizeRequest)
    return await core.prepare.run(detokenize, core, req)


def tokenize(core: Ingress, req: TokenizeRequest) -> dict[str, Any]:
    """The token ids ``req`` would be generated from, with their count."""
    if req.prompt is not None and req.messages is not None:
        raise APIError(400, "give prompt or messages, not both", param="messages")
    if req.prompt is None and req.messages is None:
        raise APIError(400, "give one of prompt and messages", param="prompt")
    tokenizer = core.tokenizer
    if req.prompt is not None:
        if req.tools is not None:
            raise APIError(400, "tools go with messages, not a prompt", param="tools")
        if req.add_special_tokens:
            ids = tokenizer.encode(req.prompt)
        elif hasattr(tokenizer, "chat_template"):  # the model's own tokenizer
            ids = tokenizer.encode(req.prompt, add_special_tokens=False)
        else:  # the byte tokenizer adds no special tokens anyway
            ids = tokenizer.encode(req.prompt)
    else:
        # The chat route's own checks of these fields (one rule for both endpoints).
        chat = parse(
            ChatRequest,
            {
                "messages": [m.model_dump(exclude_none=True) for m in req.messages or []],
                "add_generation_prompt": req.add_generation_prompt,
                "continue_final_message": req.continue_final_message,
                "chat_template_kwargs": req.chat_template_kwargs,
            },
        )
        ids = chat_prompt_ids(tokenizer, chat.messages, req.tools, chat_options(chat))
    return {
        "count": len(ids),
        "max_model_len": core.max_model_len,
        "tokens": ids,
        "token_strs": token_strs(core, ids) if req.return_token_strs else None,
    }


def token_strs(core: Ingress, ids: list[int]) -> list[str]:
    """Each id's vocabulary piece, as vLLM's ``/tokenize`` answers (``convert_ids_to_tokens``:
    ``'Ġis'`` for a byte-level BPE's `` is``); a tokenizer without pieces (the byte
    tokenizer) answers each token's own text."""
    hf = getattr(core.tokenizer, "_tok", None)
    convert = getattr(hf, "convert_ids_to_tokens", None)
    if convert is not None:
        return [str(piece) for piece in convert(ids)]
    return [core.token_texts(t) for t in ids]


def detokenize(core: Ingress, req: DetokenizeRequest) -> dict[str, Any]:
    """The text of ``req.tokens`` (special tokens skipped, as in generated text)."""
    core.check_vocab(req.tokens, "tokens")
    return {"prompt": core.tokenizer.decode(req.tokens)}


def tokenizer_info(core: Ingress) -> dict[str, Any]:
    """vLLM's ``/tokenizer_info``: the tokenizer's ``init_kwargs`` (file paths dropped, values
    made JSON), its class name and the chat template the server renders with."""
    tokenizer = core.tokenizer
    hf = getattr(tokenizer, "_tok", None)
    config = dict(getattr(hf, "init_kwargs", None) or {})
    for path_key in ("vocab_file", "merges_file", "tokenizer_file", "name_or_path"):
        config.pop(path_key, None)
    info: dict[str, Any] = {k: _as_json(v) for k, v in config.items()}
    # The special tokens' text, always present (lm-evaluation-harness's remote tokenizer reads
    # ``eos_token`` to tell a vLLM-shaped server).
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = getattr(hf, name, None) if hf is not None else None
        info[name] = value if isinstance(value, str) else info.get(name)
    info["tokenizer_class"] = type(hf if hf is not None else tokenizer).__name__
    info["model_max_length"] = core.max_model_len
    template = getattr(tokenizer, "chat_template", None)
    if template:
        info["chat_template"] = template
    return info


def _as_json(value: Any) -> Any:
    """A JSON value for ``value`` (special tokens as their text; other objects as ``str``)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_as_json(v) for v in value]
    content = getattr(value, "content", None)  # transformers' AddedToken
    return content if isinstance(content, str) else str(value)
