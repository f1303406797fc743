"""``POST /v1/responses``: OpenAI's Responses API on the chat-completions path.

A Responses request is translated into the chat request it means (``instructions`` the first
system message, ``input`` items the messages, ``max_output_tokens`` the
``max_completion_tokens``, function tools in the chat shape, ``text.format`` the
``response_format``) and runs exactly as ``/v1/chat/completions`` does: the model's chat
template, the same sampling checks and one rank request. The answer's text comes back as
output items (``deployment.openai.responses_stream``). ``previous_response_id`` continues a
conversation kept in the ingress's bounded ``ResponseStore``.

Errors have the OpenAI envelope, their ``param`` named in the Responses request's terms
(``input``, ``max_output_tokens``, ``text``), never the translated chat request's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from deployment.ingress import Ingress
from deployment.openai.chat import chat_options, chat_prompt_ids
from deployment.openai.choices import Choice, usage
from deployment.openai.errors import APIError
from deployment.openai.protocol import ChatRequest, Int, ignored, parse, refused
from deployment.openai.response_store import ResponseStore, StoredResponse
from deployment.openai.responses_stream import OutputItems, stream_response
from deployment.openai.sse import drain
from deployment.serve_context import new_request_id

TEXT_PARTS = ("input_text", "output_text", "text")
# A chat request's field -> the Responses field it came from (for error ``param``s).
RESPONSES_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text",
}


class ResponsesRequest(BaseModel):
    """The Responses API's request body. As for chat, unknown fields are refused, a declared
    field roundgate does not implement is refused unless its value asks for nothing, and a
    few that change no output are accepted and ignored. Scalars parse as for chat (and as
    vLLM's models do): lax, so ``"0.5"`` is a number, but nothing is lost in a conversion."""

    model_config = ConfigDict(extra="forbid")

    REFUSED: ClassVar[dict[str, Any]] = {
        "background": lambda v: v in (None, False),
        "conversation": lambda v: v is None,
        "include": lambda v: not v,
        "max_tool_calls": lambda v: v is None,
        "prompt": lambda v: v is None,
        "reasoning": lambda v: v is None,
        "service_tier": lambda v: v in (None, "auto", "default"),
        "top_logprobs": lambda v: v in (None, 0),
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
    store: bool = Field(True, description="keep this response for previous_response_id")
    stream: bool = False
    metadata: dict[str, str] | None = Field(None, description="echoed in the response")
    user: str | None = Field(
        None, max_length=256, description="end-user id; the cache-aware router's session key"
    )
    safety_identifier: str | None = ignored("an end-user id for the caller's own records")
    prompt_cache_key: str | None = ignored("prefix caching needs no key")
    stream_options: dict[str, Any] | None = ignored("no obfuscation padding is ever sent")
    background: bool | None = refused("null or false")
    conversation: Any = refused("null")
    include: list[str] | None = refused("null or empty")
    max_tool_calls: Int | None = refused("null")
    prompt: Any = refused("null")
    reasoning: dict[str, Any] | None = refused("null")
    service_tier: str | None = refused("null, 'auto' or 'default'")
    top_logprobs: Int | None = refused("null or 0")
    truncation: str | None = refused("null or 'disabled'")


# ---- translation: a Responses request -> the chat request it means ------------------------


def _text_of(content: object, where: str) -> str:
    """A message's content (a string or text parts) as its text; a 400 naming the part."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where}: must be a string or a list of text parts", param="input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise APIError(
                400,
                f"{where}.{j}: only text parts ({', '.join(TEXT_PARTS)}) are supported, "
                f"got {kind!r}",
                param="input",
            )
        texts.append(part["text"])
    return "".join(texts)


def _need_str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise APIError(400, f"{where}.{key}: must be a string", param="input")
    return value


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` as chat messages: text is one user message; a ``function_call`` joins the
    assistant message before it (as a chat message's ``tool_calls``); a
    ``function_call_output`` is a ``tool`` message. Output items of an earlier response
    (messages with ``id`` and ``status``) are accepted as input, as OpenAI does."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = _need_str(item, "role", where)
            messages.append({"role": role, "content": _text_of(item.get("content"), where)})
        elif kind == "function_call":
            call = {
                "id": _need_str(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _need_str(item, "name", where),
                    "arguments": _need_str(item, "arguments", where),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _need_str(item, "call_id", where),
                    "content": _text_of(output, f"{where}.output"),
                }
            )
        else:
            raise APIError(
                400,
                f"{where}: item type {kind!r} is not supported (message, function_call, "
                "function_call_output)",
                param="input",
            )
    return messages


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (``name`` at the top) in the chat shape (under
    ``function``); any other tool type (hosted search, code, ...) is a 400 naming it."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(
                400,
                f"tools.{i}: only function tools are supported, got type {tool.get('type')!r}",
                param="tools",
            )
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """``{'type': 'function', 'name': f}`` in the chat shape; strings pass as they are."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise APIError(
            400,
            "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": choice["name"]}}


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (None for plain text)."""
    if text is None:
        return None
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown or text.get("verbosity") is not None:
        name = unknown[0] if unknown else "verbosity"
        raise APIError(400, f"text.{name} is not supported by roundgate", param="text")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text" and len(fmt) == 1):
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        raise APIError(
            400, "text.format.type must be 'text', 'json_object' or 'json_schema'", param="text"
        )
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {k: v for k, v in fmt.items() if k != "type"}
    return {"type": "json_schema", "json_schema": schema}


@contextmanager
def responses_terms() -> Iterator[None]:
    """Re-raise the chat path's errors with the Responses request's field names."""
    try:
        yield
    except APIError as exc:
        param = RESPONSES_NAMES.get(exc.param or "", exc.param)
        message = exc.message
        if message.startswith("messages"):  # its indices count the instructions' message
            message = f"input (as the chat messages it renders to): {message}"
        for chat_name, name in RESPONSES_NAMES.items():
            if chat_name != "messages" and message.startswith(chat_name):
                message = name + message[len(chat_name) :]
        raise APIError(exc.status, message, param, exc.code, exc.headers) from None


def chat_request(req: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatRequest:
    """The chat request ``req`` means, over ``messages`` (instructions not included).

    Only the fields the client set are passed, so the model's generation defaults fill the
    rest exactly as they do for chat.
    """
    body: dict[str, Any] = {"messages": messages, "stream": req.stream}
    if req.instructions is not None:
        body["messages"] = [{"role": "system", "content": req.instructions}, *messages]
    optional = {
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": chat_response_format(req.text),
        "user": req.user,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    with responses_terms():
        return parse(ChatRequest, body)


# ---- the route ----------------------------------------------------------------------------


def previous_messages(store: ResponseStore, response_id: str | None) -> list[dict[str, Any]]:
    """The stored conversation ``previous_response_id`` continues; a 404 naming it."""
    if response_id is None:
        return []
    stored = store.get(response_id)
    if stored is None:
        raise APIError(
            404,
            f"Response with id {response_id!r} not found: this ingress replica keeps its "
            f"{store.max_entries} most recently used stored responses in memory (not those "
            "sent with store: false, nor those of another replica or before a restart)",
            param="previous_response_id",
            code="response_not_found",
        )
    return [dict(m) for m in stored.messages]


def response_usage(choices: list[Choice]) -> dict[str, Any]:
    counts = usage(choices)
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts["total_tokens"],
    }


class ResponseBody:
    """The response object of one request, as it stands at each step of its stream."""

    def __init__(
        self,
        response_id: str,
        model: str,
        req: ResponsesRequest,
        output: OutputItems,
        choices: list[Choice],
    ) -> None:
        self.response_id = response_id
        self.model = model
        self.req = req
        self.output = output
        self.choices = choices  # their usage, once done
        self.created_at = int(time.time())

    def __call__(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        done = status in ("completed", "incomplete")
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if done else None,
            "status": status,
            "error": error,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": [dict(item) for item in self.output.items] if done else [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "store": req.store,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "text": req.text or {"format": {"type": "text"}},
            "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [],
            "truncation": "disabled",
            "usage": response_usage(self.choices) if done else None,
            "user": req.user,
            "metadata": req.metadata or {},
        }


async def create_response(core: Ingress, request: Request) -> dict[str, Any] | StreamingResponse:
    """The route's body: the chat request the Responses request means, one rank request,
    the answer as output items (streamed as events, or whole)."""
    req = await core.read_request(request, ResponsesRequest)
    store: ResponseStore = core.responses
    with responses_terms():
        conversation = previous_messages(store, req.previous_response_id)
        conversation += input_messages(req.input)
        chat = chat_request(req, conversation)
        tools = None if chat.tool_choice == "none" else chat.tools
        ids = chat_prompt_ids(core.tokenizer, chat.messages, tools, chat_options(chat))
        rid = new_request_id()
        choices, deltas = core.generate(rid, ids, chat, chat.max_completion_tokens, "input")
    output = OutputItems(bool(tools), 1 if req.parallel_tool_calls is False else None)
    body = ResponseBody(f"resp_{rid}", core.model_name, req, output, choices)

    def keep(final: dict[str, Any]) -> None:
        if req.store:
            turn = (*conversation, output.assistant_message())
            store.put(final["id"], StoredResponse(messages=turn))

    if req.stream:
        return stream_response(deltas, output, body, keep)
    await drain(deltas)
    choice = choices[0]
    output.feed(choice.text, final=True, incomplete=choice.finish_reason == "length")
    final = body("incomplete" if output.incomplete else "completed")
    keep(final)
    return final
