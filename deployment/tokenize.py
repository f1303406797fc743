"""``/tokenize`` and ``/detokenize`` in vLLM's request and response shapes.

``/tokenize`` takes a ``prompt`` (as ``/v1/completions`` would tokenize it) or chat
``messages`` (rendered by the model's template with the generation prompt, as
``/v1/chat/completions`` would), and answers ``{count, max_model_len, tokens, token_strs}``;
``token_strs`` are each token's own decoded text. ``/detokenize`` answers ``{prompt}``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from deployment.api_errors import APIError
from deployment.protocol import ChatMessage, Int, check_tools
from deployment.tools import render_inputs


class TokenizeRequest(BaseModel):
    """Exactly one of ``prompt`` and ``messages``."""

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
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    tokens: list[Int]


def tokenize(core: Any, req: TokenizeRequest) -> dict[str, Any]:
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
        try:
            messages = [m.as_template_input() for m in req.messages]
            template = getattr(tokenizer, "chat_template", None)
            ids = tokenizer.render_chat(*render_inputs(messages, req.tools, template))
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from None
    return {
        "count": len(ids),
        "max_model_len": core.max_model_len,
        "tokens": ids,
        "token_strs": [core.token_texts(t) for t in ids] if req.return_token_strs else None,
    }


def detokenize(core: Any, req: DetokenizeRequest) -> dict[str, Any]:
    """The text of ``req.tokens`` (special tokens skipped, as in generated text)."""
    vocab = core.vocab_size
    bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(
            400, f"token id {bad} is outside the model's vocabulary [0, {vocab})", "tokens"
        )
    return {"prompt": core.tokenizer.decode(req.tokens)}
