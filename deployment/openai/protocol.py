"""OpenAI-compatible request bodies: every field is implemented, refused, or harmless.

No field is silently dropped. Unknown fields are a 400 naming them (``extra="forbid"``); a
field of OpenAI's schema that roundgate does not implement is declared, marked
``x-roundgate-supported: false`` in the OpenAPI document, and refused with a 400 naming it
unless its value asks for nothing (``REFUSED``); vLLM's own fields that roundgate does not
implement are accepted at the value that asks for nothing (``vllm_default``: vLLM's default,
so a client sending vLLM's full request works) and refused otherwise; a few fields that change
no output (``metadata``, ``safety_identifier``, ...) are accepted and documented as ignored.
``user`` is implemented: the cache-aware router's session key.

Scalars are parsed as vLLM's pydantic models parse them (lax mode: ``"true"`` is a boolean,
``"5"`` an integer); a value that would be lost in the conversion (``2.5`` as an integer) is
still a 400. docs/api.md states the whole policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from roundgate.actors.control.request import MAX_N
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.field_policy import ignored, refused, vllm_default
from roundgate.deployment.openai.field_policy import (
    parse as parse,  # re-exported: the routes' parser
)

MAX_INT32 = 2**31 - 1
MIN_INT64, MAX_INT64 = -(2**63), 2**63 - 1  # vLLM's seed range
MAX_STOP_CHARS = 256  # the detokenizer holds back up to this many characters


def _integral(value: object) -> object:
    """``2.0`` is an integer in JSON (and in JSON Schema); ``2.5`` and ``true`` are not (lax
    parsing would read ``true`` as 1: a token id or a count sent as a boolean is a mistake)."""
    if isinstance(value, bool):
        raise ValueError("Input should be a valid integer, not a boolean")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


class StreamOptions(BaseModel):
    """How a stream is framed (never what it says): keys beyond these (OpenAI's
    ``include_obfuscation``, vLLM's later additions) are accepted and ignored, as vLLM does."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = Field(
        False, description="vendor (vLLM): with include_usage, every chunk carries the usage"
    )


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(
        None,
        description="true or null: no property beyond the schema's (xgrammar's strict mode); "
        "false: JSON Schema's own rule (undeclared properties allowed unless forbidden)",
    )


class ResponseFormat(BaseModel):
    """``text``, ``json_object`` (any JSON object) or ``json_schema`` (that schema)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_only_with_its_type(self) -> ResponseFormat:
        if self.json_schema is not None and self.type != "json_schema":
            raise ValueError(f"json_schema goes with type 'json_schema', not {self.type!r}")
        return self


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs``: exactly one constraint on the output."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json", description="a JSON schema")
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1, max_length=256)] | None = None
    grammar: str | None = Field(None, description="an EBNF grammar (xgrammar's dialect)")
    json_object: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [
            name
            for name in ("json_", "regex", "choice", "grammar")
            if getattr(self, name) is not None
        ]
        if self.json_object:
            given.append("json_object")
        if len(given) != 1:
            names = ", ".join(n.rstrip("_") for n in given) or "none"
            raise ValueError(
                f"give exactly one of json, regex, choice, grammar, json_object (got {names})"
            )
        return self


class _Common(BaseModel):
    """Fields shared by completions and chat. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

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
    seed: Int | None = Field(None, ge=MIN_INT64, le=MAX_INT64)
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
    structured_outputs: StructuredOutputs | None = Field(
        None, description="vendor (vLLM): json, regex, choice, grammar (EBNF) or json_object"
    )
    prompt_logprobs: Int | None = Field(
        None,
        ge=-1,
        le=MAX_INT32,
        description="vendor (vLLM): each prompt token's logprob and the top k (not streamed); "
        "-1: the whole vocabulary (refused past the server's maximum, as vLLM's)",
    )
    truncate_prompt_tokens: Int | None = Field(
        None, ge=1, description="vendor (vLLM): keep this many prompt tokens"
    )
    truncation_side: Literal["left", "right"] = Field(
        "left", description="vendor (vLLM): 'left' keeps the last tokens, 'right' the first"
    )
    skip_special_tokens: bool = Field(True, description="vendor (vLLM): drop them from text")
    spaces_between_special_tokens: bool = Field(
        True,
        description="vendor (vLLM): accepted; fast tokenizers (all roundgate loads) have no "
        "such option, so text is the same either way",
    )
    include_stop_str_in_output: bool = Field(
        False, description="vendor (vLLM): keep the stop string that ended the text"
    )
    service_tier: str | None = refused("null, 'auto' or 'default'")
    store: bool | None = refused("null or false")
    metadata: dict[str, Any] | None = ignored("caller's key-value tags")
    prompt_cache_key: str | None = ignored("prefix caching needs no key")
    safety_identifier: str | None = ignored("an end-user id for the caller's own records")
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's fields roundgate does not implement: accepted at the value that asks for nothing.
    use_beam_search: bool = Field(
        False, description="vendor (vLLM): beam search of width n (not streamed)"
    )
    length_penalty: float = Field(
        1.0,
        ge=-10.0,
        le=10.0,
        description="vendor (vLLM): beam score = logprob / length ** length_penalty",
    )
    early_stopping: bool | None = vllm_default(False, None)
    watermarking: bool | None = vllm_default(False, None)
    allowed_token_ids: list[Int] | None = vllm_default(None)
    bad_words: list[str] | None = vllm_default([], None)
    priority: Int | None = vllm_default(0, None)
    cache_salt: str | None = vllm_default(None)
    logprob_token_ids: list[Int] | None = vllm_default(None)
    return_tokens_as_token_ids: bool | None = Field(
        None, description="vendor (vLLM): logprobs name each token 'token_id:N', not its text"
    )
    kv_transfer_params: dict[str, Any] | None = vllm_default(None)
    vllm_xargs: dict[str, Any] | None = vllm_default(None)
    repetition_detection: dict[str, Any] | None = vllm_default(None)
    stream_interval: Int | None = vllm_default(1, None)
    request_id: str | None = ignored("the response's id is the server's own")
    min_characters: Int | None = ignored(
        "no OpenAI or vLLM field: vLLM's test suite sends it and vLLM ignores it"
    )
    dp_rank: Int | None = Field(None, ge=0, description="vendor field: pin to one DP rank")
    return_token_ids: bool = Field(False, description="vendor field: add token ids to choices")
    user: str | None = Field(
        None, max_length=256, description="end-user id; the cache-aware router's session key"
    )

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        """``null`` for a field with a default means that default, as in vLLM's models (its
        sampling fields are optional, ``None`` standing for the server's default)."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            k: v
            for k, v in data.items()
            if v is not None
            or k not in fields
            or fields[k].is_required()
            or fields[k].default is None
        }

    def check_combinations(self) -> None:
        """Fields that are valid alone but not together: a 400 naming the second."""
        options = self.stream_options
        # vLLM's rule and wording: empty options are no options.
        if options is not None and options.model_fields_set and not self.stream:
            raise APIError(
                400,
                "Stream options can only be defined when `stream=True`.",
                param="stream_options",
            )
        if self.prompt_logprobs is not None and self.stream:
            raise APIError(
                400, "prompt_logprobs are not available with stream: true", "prompt_logprobs"
            )

    def truncated(self, ids: list[int]) -> list[int]:
        """``ids`` cut to ``truncate_prompt_tokens`` from ``truncation_side`` (vLLM's)."""
        keep = self.truncate_prompt_tokens
        if keep is None or len(ids) <= keep:
            return ids
        return ids[-keep:] if self.truncation_side == "left" else ids[:keep]

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])  # normalised to a list by the validator


class CompletionRequest(_Common):
    # Required, but ``null`` is a value (vLLM's ``prompt_embeds`` requests send it): an empty
    # or null prompt is a 400 in vLLM's wording.
    prompt: str | list[str] | list[Int] | list[list[Int]] | None = Field(
        description="text, texts, token ids (within the tokenizer's vocabulary) or lists of them"
    )
    prompt_embeds: str | list[Any] | None = vllm_default(None, [], "")
    add_special_tokens: bool | None = vllm_default(True, None)
    max_tokens: Int | None = Field(
        None, ge=0, description="0: score the prompt only (with echo or prompt_logprobs)"
    )
    echo: bool = False
    logprobs: Int | None = Field(
        None,
        ge=-1,
        le=MAX_INT32,
        description="-1 (vLLM's): the whole vocabulary; at most the server's max_logprobs",
    )
    best_of: Int | None = refused("null or 1")
    suffix: str | None = refused("null or empty")

    REFUSED: ClassVar[dict[str, Callable[[Any], bool]]] = {
        **_Common.REFUSED,
        "best_of": lambda v: v in (None, 1),
        "suffix": lambda v: not v,
    }

    def check_combinations(self) -> None:
        super().check_combinations()
        if self.max_tokens == 0 and not self.echo and self.prompt_logprobs is None:
            raise APIError(
                400,
                "max_tokens 0 only scores the prompt: it needs echo or prompt_logprobs",
                param="max_tokens",
            )


class ChatMessage(BaseModel):
    """One chat message. Unknown keys are accepted and ignored (as vLLM: SDKs and agent
    frameworks attach their own), so they never reach the template."""

    model_config = ConfigDict(extra="ignore")
    # Any role, as vLLM (its ``CustomChatCompletionMessageParam``): the template sees it as
    # sent, and a template that does not know it says so (a 400 naming ``messages``).
    role: str = Field(min_length=1)
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


# apply_chat_template's own arguments: chat_template_kwargs may not override them.
RENDER_ARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


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
    logprobs: bool | None = False
    top_logprobs: Int | None = Field(
        None,
        ge=-1,
        le=MAX_INT32,
        description="needs logprobs: true; -1: the whole vocabulary; at most max_logprobs",
    )
    tools: list[dict[str, Any]] | None = Field(
        None, description="rendered by the chat template; <tool_call> output is parsed"
    )
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="'none', 'auto', 'required' (enforced) or a named function (enforced)"
    )
    parallel_tool_calls: bool | None = Field(
        None, description="false: at most one tool call is returned (the first)"
    )
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
    add_generation_prompt: bool = Field(
        True, description="vendor (vLLM): end the prompt with the assistant's turn opened"
    )
    continue_final_message: bool = Field(
        False, description="vendor (vLLM): continue the last (assistant) message"
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="vendor (vLLM): extra variables for the chat template"
    )
    echo: bool | None = Field(
        False,
        description="vendor (vLLM): the answer starts with the last message's content when "
        "that message has the answer's role (with continue_final_message: the whole turn)",
    )
    add_special_tokens: bool | None = vllm_default(False, None)
    documents: list[dict[str, Any]] | None = vllm_default(None)
    chat_template: str | None = vllm_default(None)
    mm_processor_kwargs: dict[str, Any] | None = vllm_default(None)
    media_io_kwargs: dict[str, Any] | None = vllm_default(None)
    include_reasoning: bool | None = vllm_default(True, None)
    thinking_token_budget: Int | None = vllm_default(None)

    _tools = field_validator("tools")(check_tools)
    _tool_choice = field_validator("tool_choice")(_check_tool_choice)

    def check_combinations(self) -> None:
        super().check_combinations()
        if self.continue_final_message and self.add_generation_prompt:
            raise APIError(
                400,
                "continue_final_message needs add_generation_prompt: false",
                param="continue_final_message",
            )
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise APIError(
                400,
                "continue_final_message needs the last message to be the assistant's",
                param="continue_final_message",
            )
        taken = sorted(RENDER_ARGS & set(self.chat_template_kwargs or {}))
        if taken:
            raise APIError(
                400,
                f"chat_template_kwargs may not set {', '.join(taken)} (the request's own fields)",
                param="chat_template_kwargs",
            )

    REFUSED: ClassVar[dict[str, Callable[[Any], bool]]] = {
        **_Common.REFUSED,
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
