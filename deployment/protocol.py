"""OpenAI-compatible request bodies and the error envelope."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

MAX_INT32 = 2**31 - 1


def _integral(value: Any) -> Any:
    """``2.0`` is an integer in JSON (and in JSON Schema); ``2.5`` and ``true`` are not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]
StopString = Annotated[str, Field(min_length=1)]


class APIError(Exception):
    """An error answered with an OpenAI-style body; never a 5xx for the client's mistake."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            413: "invalid_request_error",
            503: "service_unavailable",
        }.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


# Strict types: ``"max_tokens": true`` or ``"stream": "yes"`` is the client's mistake (400),
# not something to coerce; ints are still accepted where a float is expected, and integral
# floats where an int is (``Int``). Constraints live in the fields, so the OpenAPI document
# states them: a body that fits the schema is refused only for what depends on the model
# (context length, vocabulary) or is unsupported (``n > 1``).
class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    """Fields shared by completions and chat. Unknown fields are ignored, as OpenAI does."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    max_tokens: Int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # Bounded: the rank packs sampling parameters into int64 tensors.
    top_k: Int = Field(0, ge=-1, le=MAX_INT32)
    seed: Int | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=4)] | None = None
    stop_token_ids: list[Int] | None = None
    ignore_eos: bool = False
    n: Int = Field(1, ge=1, description="only 1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    dp_rank: Int | None = Field(None, ge=0, description="vendor field: pin to one DP rank")
    return_token_ids: bool = Field(False, description="vendor field: add token ids to choices")
    user: str | None = Field(
        None, max_length=256, description="end-user id; the cache-aware router's session key"
    )

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        return [value] if isinstance(value, str) else value

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])  # normalised to a list by the validator


class CompletionRequest(_Common):
    prompt: str | list[str] | list[Int] | list[list[Int]] = Field(
        description="text, texts, token ids (within the tokenizer's vocabulary) or lists of them"
    )
    echo: bool = False
    logprobs: Int | None = None
    best_of: Int | None = None
    suffix: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)

    def as_template_input(self) -> dict[str, Any]:
        """The message as chat templates read it (text content; tool fields when given)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        for key in ("name", "tool_call_id", "tool_calls"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, ge=1)
    logprobs: bool | None = None
    tools: list[dict[str, Any]] | None = Field(
        None, description="passed to the model's chat template (no tool-call parsing yet)"
    )


def parse(model: type[BaseModel], body: Any) -> Any:
    """``body`` (decoded JSON) as ``model``, or a 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        param, message = describe_error(exc)
        raise APIError(400, message, param=param) from None


def describe_error(exc: ValidationError) -> tuple[str | None, str]:
    """``(param, message)`` for the first invalid field, e.g. ``("max_tokens", "max_tokens: ...")``.

    A union field (``prompt``, ``stop``, a message's ``content``) fails once per accepted
    form, each error tagged with the form (``prompt.list[int].0``). When the value has the
    right type for exactly one form, that form's complaint is the message; otherwise the
    message names the accepted forms.
    """
    errors = exc.errors()
    first = errors[0]["loc"]
    param = str(first[0]) if first else None
    cut = next((i for i, p in enumerate(first) if _is_union_tag(p)), None)
    if cut is None:
        return param, f"{_dotted(first) or 'body'}: {errors[0]['msg']}"
    forms = [
        e
        for e in errors
        if len(e["loc"]) > cut and e["loc"][:cut] == first[:cut] and _is_union_tag(e["loc"][cut])
    ]
    near = [e for e in forms if not e["type"].endswith("_type")]
    if len(near) == 1:
        return param, f"{_dotted(near[0]['loc'])}: {near[0]['msg']}"
    names = ", ".join(dict.fromkeys(_form_name(str(e["loc"][cut])) for e in forms))
    return param, f"{_dotted(first)}: invalid type or value; expected one of {names}"


def _is_union_tag(part: Any) -> bool:
    """pydantic's name of a union member in an error location (``str``, ``list[int]``)."""
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool"} or "[" in part or "-" in part
    )


def _dotted(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if not _is_union_tag(p))


def _form_name(tag: str) -> str:
    """``list[function-before[_integral(), int]]`` -> ``list[int]``."""
    tag = re.sub(r"function-[a-z]+\[[^\[\]]*?, ([^\[\]]+)\]", r"\1", tag)
    return tag.replace("constrained-", "")
