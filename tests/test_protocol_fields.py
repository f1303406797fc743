"""No silent fields: every field of OpenAI's request schemas is implemented or refused.

The reference is the official ``openai`` package's own request types: each of their fields
must be declared by our models; an unknown field is a 400 naming it; a declared field that is
not implemented is a 400 naming it unless its value asks for nothing, and the OpenAPI document
marks it ``x-roundgate-supported: false``.
"""

from __future__ import annotations

import typing
from typing import Any

import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_params

from roundgate.deployment.openai.api import api
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.protocol import ChatRequest, CompletionRequest, parse

MESSAGES = [{"role": "user", "content": "hi"}]
BASE = {CompletionRequest: {"prompt": "hi"}, ChatRequest: {"messages": MESSAGES}}
OPENAI_FIELDS = {
    CompletionRequest: set(
        typing.get_type_hints(completion_create_params.CompletionCreateParamsBase)
    ),
    ChatRequest: set(chat_params.CompletionCreateParamsBase.__annotations__),
}
# A value of each refused field that asks for something roundgate does not do.
ASKING = {
    "service_tier": "flex",
    "store": True,
    "best_of": 3,
    "suffix": "tail",
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "audio": {"voice": "alloy"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "high",
    "verbosity": "low",
    "web_search_options": {},
    "moderation": {"model": "x"},
}


def openapi_schema(model: type) -> dict[str, Any]:
    import roundgate.deployment.app  # noqa: F401  (registers the routes before the document is cached)

    return api.openapi()["components"]["schemas"][model.__name__]


def refusal(model: type, body: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as info:
        parse(model, {**BASE[model], **body})
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("model", [CompletionRequest, ChatRequest], ids=["completions", "chat"])
def test_every_openai_field_is_declared(model: type) -> None:
    assert OPENAI_FIELDS[model] - set(model.model_fields) == set()


@pytest.mark.parametrize("model", [CompletionRequest, ChatRequest], ids=["completions", "chat"])
def test_unknown_fields_are_refused_by_name(model: type) -> None:
    exc = refusal(model, {"frobnicate": 1})
    assert exc.param == "frobnicate" and "unknown field" in exc.message
    if model is ChatRequest:  # inside a message, unknown keys are accepted and ignored
        req = parse(model, {"messages": [{"role": "user", "content": "x", "mood": "ok"}]})
        assert req.messages[0].as_template_input() == {"role": "user", "content": "x"}


@pytest.mark.parametrize(
    ("model", "name"),
    [(m, n) for m in (CompletionRequest, ChatRequest) for n in m.REFUSED],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_refused_fields_name_themselves_unless_they_ask_nothing(model: type, name: str) -> None:
    exc = refusal(model, {name: ASKING[name]})
    assert exc.param == name and name in exc.message
    schema = openapi_schema(model)
    assert schema["properties"][name]["x-roundgate-supported"] is False


def test_neutral_values_of_refused_fields_are_accepted() -> None:
    neutral = {"store": False, "service_tier": "auto", "best_of": 1, "suffix": ""}
    parse(CompletionRequest, {"prompt": "x", **neutral})
    chat = {"tool_choice": "auto", "parallel_tool_calls": True, "response_format": None}
    parse(ChatRequest, {"messages": MESSAGES, "response_format": {"type": "text"}})
    parse(ChatRequest, {"messages": MESSAGES, "modalities": ["text"], **chat})


def test_message_level_refusals_name_the_field() -> None:
    exc = refusal(ChatRequest, {"messages": [{"role": "user", "content": "x", "audio": {}}]})
    assert exc.param == "messages" and "audio is not supported" in exc.message


@pytest.mark.parametrize("model", [CompletionRequest, ChatRequest], ids=["completions", "chat"])
def test_the_openapi_document_says_which_fields_are_supported(model: type) -> None:
    schema = openapi_schema(model)
    assert schema["additionalProperties"] is False
    marks = {k: v.get("x-roundgate-supported") for k, v in schema["properties"].items()}
    assert {k for k, v in marks.items() if v is False} == set(model.REFUSED)
    assert {k for k, v in marks.items() if v == "ignored"} >= {"metadata"} & set(marks)
    assert marks["user"] is not False and marks["user"] != "ignored"  # the router's session key
