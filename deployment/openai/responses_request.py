"""The Responses API's request body, and the checks its fields' types cannot make.

As for chat, unknown fields are refused, a declared field roundgate does not implement is
refused unless its value asks for nothing, and a few that change no output are accepted and
ignored. vLLM's sampling extensions are declared loosely here and checked by the chat request
they become (``roundgate.deployment.openai.responses.chat_request``), so one set of rules holds for
both.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.protocol import MAX_INT32, Int, ignored, refused

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# vLLM's extensions of the Responses request that are chat fields too: passed to the chat
# request as they are, so the chat path's checks (and refusals) apply unchanged.
VLLM_CHAT_FIELDS = (
    "top_k",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "chat_template_kwargs",
    "priority",
    "cache_salt",
    "vllm_xargs",
    "kv_transfer_params",
)


def _as_chat(field: str) -> Any:
    return Field(None, description=f"vLLM's extension: chat completions' {field}")


class ResponsesRequest(BaseModel):
    """The Responses API's request body. As for chat, unknown fields are refused, a declared
    field roundgate does not implement is refused unless its value asks for nothing, and a
    few that change no output are accepted and ignored. Scalars parse as for chat (and as
    vLLM's models do): lax, so ``"0.5"`` is a number, but nothing is lost in a conversion."""

    model_config = ConfigDict(extra="forbid")

    REFUSED: ClassVar[dict[str, Any]] = {
        "conversation": lambda v: v is None,
        "max_tool_calls": lambda v: v is None,
        "prompt": lambda v: v is None,
        "reasoning": lambda v: v is None,
        "service_tier": lambda v: v in (None, "auto", "default"),
        "truncation": lambda v: v in (None, "disabled"),
    }

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(
        description="text (one user message) or a list of message, function_call and "
        "function_call_output items"
    )
    instructions: str | None = Field(None, description="the first (system) message")
    max_output_tokens: Int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = Field(
        None, description="function tools: {'type': 'function', 'name', 'parameters', ...}"
    )
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="'none', 'auto', 'required' or {'type': 'function', 'name': ...}"
    )
    parallel_tool_calls: bool | None = Field(None, description="false: the first call only")
    text: dict[str, Any] | None = Field(
        None, description="{'format': {'type': 'text' | 'json_object' | 'json_schema', ...}}"
    )
    previous_response_id: str | None = Field(
        None, description="continue a stored response's conversation (see docs/responses-api.md)"
    )
    store: bool = Field(True, description="keep this response (GET, previous_response_id)")
    background: bool | None = Field(
        None, description="answer at once (queued); poll GET /v1/responses/{id}; needs store"
    )
    include: list[str] | None = Field(
        None, description=f"only {LOGPROBS_INCLUDE!r}: each output token's logprob"
    )
    top_logprobs: Int | None = Field(
        None, ge=0, le=MAX_INT32, description=f"with include {LOGPROBS_INCLUDE!r}"
    )
    stream: bool = False
    metadata: dict[str, str] | None = Field(None, description="echoed in the response")
    user: str | None = Field(
        None, max_length=256, description="end-user id; the cache-aware router's session key"
    )
    safety_identifier: str | None = ignored("an end-user id for the caller's own records")
    prompt_cache_key: str | None = ignored("prefix caching needs no key")
    stream_options: dict[str, Any] | None = ignored("no obfuscation padding is ever sent")
    request_id: str | None = ignored("the response's id is the server's own")
    conversation: Any = refused("null")
    max_tool_calls: Int | None = refused("null")
    prompt: Any = refused("null")
    reasoning: dict[str, Any] | None = refused("null")
    service_tier: str | None = refused("null, 'auto' or 'default'")
    truncation: str | None = refused("null or 'disabled'")
    top_k: Any = _as_chat("top_k")
    logit_bias: Any = _as_chat("logit_bias")
    presence_penalty: Any = _as_chat("presence_penalty")
    frequency_penalty: Any = _as_chat("frequency_penalty")
    repetition_penalty: Any = _as_chat("repetition_penalty")
    seed: Any = _as_chat("seed")
    stop: Any = _as_chat("stop")
    ignore_eos: Any = _as_chat("ignore_eos")
    skip_special_tokens: Any = _as_chat("skip_special_tokens")
    include_stop_str_in_output: Any = _as_chat("include_stop_str_in_output")
    chat_template_kwargs: Any = _as_chat("chat_template_kwargs")
    priority: Any = _as_chat("priority")
    cache_salt: Any = _as_chat("cache_salt")
    vllm_xargs: Any = _as_chat("vllm_xargs")
    kv_transfer_params: Any = _as_chat("kv_transfer_params")

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())


def check_request(req: ResponsesRequest) -> None:
    """What the fields' own types cannot say: ``include``'s values and ``background``'s
    partners (vLLM's wording where vLLM refuses the same)."""
    for i, name in enumerate(req.include or ()):
        if name != LOGPROBS_INCLUDE:
            raise APIError(
                400,
                f"include.{i}: {name!r} is not supported by roundgate (only "
                f"{LOGPROBS_INCLUDE!r}: there is no reasoning, search or tool output to add)",
                param="include",
            )
    if req.background and not req.store:
        raise APIError(400, "background can only be used when `store` is true", "background")
    if req.background and req.stream:
        raise APIError(
            400,
            "background with stream is not supported by roundgate: poll "
            "GET /v1/responses/{id} instead",
            param="background",
        )
