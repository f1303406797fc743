"""OpenAI-compatible request bodies: every field is implemented, refused, or harmless.

No field is silently dropped. Unknown fields are a 400 naming them (``extra="forbid"``); a
field of OpenAI's schema that roundgate does not implement is declared, marked
``x-roundgate-supported: false`` in the OpenAPI document, and refused with a 400 naming it
unless its value asks for nothing (``REFUSED``); a few fields that change no output
(``metadata``, ``safety_identifier``, ...) are accepted and documented as ignored. ``user`` is
implemented: the cache-aware router's session key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from actors.control.request import MAX_N
from deployment.openai.errors import APIError, describe_error

MAX_INT32 = 2**31 - 1
MAX_STOP_CHARS = 256  # the detokenizer holds back up to this many characters


def _integral(value: object) -> object:
    """``2.0`` is an integer in JSON (and in JSON Schema); ``2.5`` and ``true`` are not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


def refused(what: str) -> Any:
    """A declared field roundgate does not implement (``what``: the values it accepts)."""
    return Field(
        None,
        description=f"Not supported: refused with a 400 unless {what}.",
        json_schema_extra={"x-roundgate-supported": False},
    )


def ignored(description: str) -> Any:
    """A field accepted and ignored on purpose: it changes nothing in the output."""
    return Field(
        None,
        description=f"Accepted and ignored: {description}.",
        json_schema_extra={"x-roundgate-supported": "ignored"},
    )


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``text``, ``json_object`` (any JSON object) or ``json_schema`` (that schema)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class _Common(BaseModel):
    """Fields shared by completions and chat. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Declared but not implemented: field -> whether a value asks for nothing (then it is
    # accepted). Everything else in the models is implemented.
    REFUSED: ClassVar[dict[str, Callable[[Any], bool]]] = {
        "service_tier": lambda v: v in (None, "auto", "default"),
        "store": lambda v: v in (None, False),
    }

    model: str | None = None
    max_tokens: Int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # Bounded: the rank packs sampling parameters into int64 tensors.
    top_k: Int = Field(0, ge=-1, le=MAX_INT32)
    seed: Int | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=4)] | None = None
    stop_token_ids: Annotated[list[Int], Field(max_length=256)] | None = None
    ignore_eos: bool = False
    n: Int = Field(1, ge=1, le=MAX_N, description="sequences per prompt (one shared prefill)")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(
        1.0, gt=0.0, le=100.0, description="vendor field: transformers' repetition penalty"
    )
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="vendor field")
    min_tokens: Int = Field(0, ge=0, le=MAX_INT32, description="vendor field")
    logit_bias: Annotated[dict[str, Bias], Field(max_length=1024)] | None = Field(
        None, description="token id (as a string) -> bias added to its logit"
    )
    guided_json: dict[str, Any] | None = Field(None, description="vendor: output follows it")
    guided_regex: str | None = Field(None, description="vendor: output matches the regex")
    guided_choice: Annotated[list[str], Field(min_length=1, max_length=256)] | None = Field(
        None, description="vendor: output is exactly one of these strings"
    )
    service_tier: str | None = refused("null, 'auto' or 'default'")
    store: bool | None = refused("null or false")
    metadata: dict[str, Any] | None = ignored("caller's key-value tags")
    prompt_cache_key: str | None = ignored("prefix caching needs no key")
    safety_identifier: str | None = ignored("an end-user id for the caller's own records")
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
    logprobs: Int | None = Field(None, ge=0, le=20)
    best_of: Int | None = refused("null or 1")
    suffix: str | None = refused("null or empty")

    REFUSED: ClassVar[dict[str, Callable[[Any], bool]]] = {
        **_Common.REFUSED,
        "best_of": lambda v: v in (None, 1),
        "suffix": lambda v: not v,
    }


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    refusal: str | None = Field(None, description="accepted on assistant turns; not rendered")
    audio: dict[str, Any] | None = refused("null")
    function_call: dict[str, Any] | None = refused("null (deprecated; use tool_calls)")

    @model_validator(mode="after")
    def _refuse(self) -> ChatMessage:
        for name in ("audio", "function_call"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is not supported by roundgate")
        return self

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


def check_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Each tool is ``{"type": "function", "function": {"name": str, ...}}`` (parameters, if
    given, an object schema): templates and the tool grammar read exactly these keys."""
    for i, tool in enumerate(tools or []):
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, dict):
            raise ValueError(f"tool {i} must be {{'type': 'function', 'function': {{...}}}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tool {i}: function.name must be a non-empty string")
        if not isinstance(fn.get("parameters", {}), dict):
            raise ValueError(f"tool {i}: function.parameters must be a JSON schema object")
    return tools


def _check_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(fn, dict)
        and isinstance(fn.get("name"), str)
    ):
        raise ValueError(
            "must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}"
        )
    return choice


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Int | None = Field(None, ge=0, le=20, description="needs logprobs: true")
    tools: list[dict[str, Any]] | None = Field(
        None, description="rendered by the chat template; <tool_call> output is parsed"
    )
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="'none', 'auto', 'required' (enforced) or a named function (enforced)"
    )
    parallel_tool_calls: bool | None = refused("null or true")
    response_format: ResponseFormat | None = None
    functions: list[dict[str, Any]] | None = refused("null (deprecated; use tools)")
    function_call: str | dict[str, Any] | None = refused("null (deprecated; use tool_choice)")
    audio: dict[str, Any] | None = refused("null")
    modalities: list[str] | None = refused("null or ['text']")
    prediction: dict[str, Any] | None = refused("null")
    reasoning_effort: str | None = refused("null")
    verbosity: str | None = refused("null")
    web_search_options: dict[str, Any] | None = refused("null")
    moderation: Any = refused("null")
    prompt_cache_options: dict[str, Any] | None = ignored("prefix caching needs no options")
    prompt_cache_retention: str | None = ignored("prefix caching keeps what fits")

    _tools = field_validator("tools")(check_tools)
    _tool_choice = field_validator("tool_choice")(_check_tool_choice)

    REFUSED: ClassVar[dict[str, Callable[[Any], bool]]] = {
        **_Common.REFUSED,
        "parallel_tool_calls": lambda v: v in (None, True),
        "functions": lambda v: v is None,
        "function_call": lambda v: v is None,
        "audio": lambda v: v is None,
        "modalities": lambda v: v in (None, ["text"]),
        "prediction": lambda v: v is None,
        "reasoning_effort": lambda v: v is None,
        "verbosity": lambda v: v is None,
        "web_search_options": lambda v: v is None,
        "moderation": lambda v: v is None,
    }


Body = TypeVar("Body", bound=BaseModel)


def parse(model: type[Body], body: object) -> Body:
    """``body`` (decoded JSON) as ``model``, or a 400 naming the first bad or refused field."""
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    try:
        req = model.model_validate(body)
    except ValidationError as exc:
        param, message = describe_error(exc)
        raise APIError(400, message, param=param) from None
    for name, accepts in getattr(model, "REFUSED", {}).items():
        if name in req.model_fields_set and not accepts(getattr(req, name)):
            raise APIError(400, f"{name} is not supported by roundgate", param=name)
    return req
