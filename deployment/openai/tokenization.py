"""``/tokenize`` and ``/detokenize`` in vLLM's request and response shapes.

``/tokenize`` takes a ``prompt`` (as ``/v1/completions`` would tokenize it) or chat
``messages`` (rendered by the model's template with the generation prompt, as
``/v1/chat/completions`` would), and answers ``{count, max_model_len, tokens, token_strs}``;
``token_strs`` are each token's own decoded text. ``/detokenize`` answers ``{prompt}``.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from deployment.ingress import Ingress
from deployment.openai.chat import chat_prompt_ids
from deployment.openai.errors import APIError
from deployment.openai.protocol import ChatMessage, Int, check_tools


class TokenizeRequest(BaseModel):
    """``/tokenize``: exactly one of ``prompt`` and ``messages``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = Field(True, description="prompt only: BOS/EOS as the model adds")
    add_generation_prompt: bool = Field(
        True, description="messages only; false is refused (chat always adds it)"
    )
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False

    _tools = field_validator("tools")(check_tools)


class DetokenizeRequest(BaseModel):
    """``/detokenize``: token ids to text."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    tokens: list[Int]


async def tokenize_route(core: Ingress, request: Request) -> dict[str, Any]:
    """The ``/tokenize`` route's body."""
    return tokenize(core, await core.read_request(request, TokenizeRequest))


async def detokenize_route(core: Ingress, request: Request) -> dict[str, Any]:
    """The ``/detokenize`` route's body."""
    return detokenize(core, await core.read_request(request, DetokenizeRequest))


def tokenize(core: Ingress, req: TokenizeRequest) -> dict[str, Any]:
    """The token ids ``req`` would be generated from, with their count."""
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", param="prompt")
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
        if not req.add_generation_prompt:
            raise APIError(
                400, "add_generation_prompt: false is not supported", "add_generation_prompt"
            )
        ids = chat_prompt_ids(tokenizer, req.messages or [], req.tools)
    return {
        "count": len(ids),
        "max_model_len": core.max_model_len,
        "tokens": ids,
        "token_strs": [core.token_texts(t) for t in ids] if req.return_token_strs else None,
    }


def detokenize(core: Ingress, req: DetokenizeRequest) -> dict[str, Any]:
    """The text of ``req.tokens`` (special tokens skipped, as in generated text)."""
    core.check_vocab(req.tokens, "tokens")
    return {"prompt": core.tokenizer.decode(req.tokens)}
