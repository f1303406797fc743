"""``POST /v1/responses``: OpenAI's Responses API on the chat-completions path.

A Responses request is translated into the chat request it means (``instructions`` the first
system message, ``input`` items the messages, ``max_output_tokens`` the
``max_completion_tokens``, function tools in the chat shape, ``text.format`` the
``response_format``, vLLM's extra sampling fields as they are) and runs exactly as
``/v1/chat/completions`` does: the model's chat template, the same sampling checks and one
rank request. The answer's text comes back as output items
(``roundgate.deployment.openai.responses_stream``). ``previous_response_id`` continues a
conversation kept in the Responses store every ingress replica shares
(``roundgate.deployment.openai.stored_responses``); ``background`` runs it as a task of this
replica, readable and cancellable through any
(``roundgate.deployment.openai.responses_background``).

Errors have the OpenAI envelope, their ``param`` named in the Responses request's terms
(``input``, ``max_output_tokens``, ``text``), never the translated chat request's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.chat import chat_options, chat_prompt_ids
from roundgate.deployment.openai.choices import Choice
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.logprobs import chat_logprobs, logprob_texts
from roundgate.deployment.openai.protocol import ChatRequest, parse
from roundgate.deployment.openai.response_body import ResponseBody
from roundgate.deployment.openai.response_store import MAX_ENTRY_BYTES, StoredResponse
from roundgate.deployment.openai.responses_input import (
    chat_response_format,
    chat_tool_choice,
    chat_tools,
    input_messages,
)
from roundgate.deployment.openai.responses_request import (
    VLLM_CHAT_FIELDS,
    ResponsesRequest,
    check_request,
)
from roundgate.deployment.openai.responses_stream import OutputItems, stream_response
from roundgate.deployment.openai.sse import drain
from roundgate.deployment.openai.stored_responses import StoredResponses
from roundgate.deployment.serve_context import new_request_id

# A chat request's field -> the Responses field it came from (for error ``param``s).
RESPONSES_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text",
}


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
        **{name: getattr(req, name) for name in VLLM_CHAT_FIELDS},
    }
    if req.wants_logprobs:
        optional.update(logprobs=True, top_logprobs=req.top_logprobs or 0)
    body.update({k: v for k, v in optional.items() if v is not None})
    with responses_terms():
        return parse(ChatRequest, body)


# ---- the route ----------------------------------------------------------------------------


async def previous_messages(
    store: StoredResponses, response_id: str | None
) -> list[dict[str, Any]]:
    """The stored conversation ``previous_response_id`` continues; a 404 naming it."""
    if response_id is None:
        return []
    stored = await store.get(response_id)
    if stored is None:
        raise APIError(
            404,
            f"Response with id {response_id!r} not found: the server keeps its most recently "
            "used stored responses (not those sent with store: false, nor those deleted)",
            param="previous_response_id",
            code="response_not_found",
        )
    if stored.conversation_bytes is not None:
        raise APIError(
            400,
            f"Response with id {response_id!r} has a conversation of "
            f"{stored.conversation_bytes} bytes, more than the server keeps "
            f"({MAX_ENTRY_BYTES} per response): resend the history in input",
            param="previous_response_id",
            code="conversation_too_large",
        )
    if not stored.messages:
        raise APIError(
            400,
            f"Response with id {response_id!r} is {stored.status}: only a completed or "
            "incomplete response can be continued",
            param="previous_response_id",
        )
    return [dict(m) for m in stored.messages]


def logprob_items(core: Ingress, ids: list[int], choice_lps: list | None) -> list | None:
    """The Responses API's logprobs of ``ids`` (the chat shape's ``content`` entries)."""
    if choice_lps is None:
        return None
    return chat_logprobs(logprob_texts(core.token_texts, None), ids, choice_lps)["content"]


async def create_response(core: Ingress, request: Request) -> dict[str, Any] | StreamingResponse:
    """The route's body: the chat request the Responses request means, one rank request,
    the answer as output items (streamed as events, whole, or queued in the background)."""
    req = await core.read_request(request, ResponsesRequest)
    check_request(req)
    store = core.responses
    if req.background:
        core.background.check_room()
    with responses_terms():
        conversation = await previous_messages(store, req.previous_response_id)
        conversation += input_messages(req.input)
        chat = chat_request(req, conversation)
        tools = None if chat.tool_choice == "none" else chat.tools
        ids = chat_prompt_ids(core.tokenizer, chat.messages, tools, chat_options(chat))
        rid = new_request_id()
        choices, deltas = core.generate(rid, ids, chat, chat.max_completion_tokens, "input")
    output = OutputItems(bool(tools), 1 if req.parallel_tool_calls is False else None)
    body = ResponseBody(f"resp_{rid}", core.model_name, req, output, choices)

    async def keep(final: dict[str, Any]) -> None:
        if req.store:
            turn = (*conversation, output.assistant_message())
            stored = StoredResponse(messages=turn, body=final, background=bool(req.background))
            # A background response's end is its owner's: kept unless cancelled meanwhile.
            await (store.finish if req.background else store.put)(final["id"], stored)

    def logprobs_of(ids: list[int], lps: list | None) -> list | None:
        return logprob_items(core, ids, lps) if req.wants_logprobs else None

    async def finish() -> dict[str, Any]:
        await drain(deltas)
        choice: Choice = choices[0]
        lps = logprobs_of(choice.output_token_ids, choice.logprobs)
        incomplete = choice.finish_reason == "length"
        output.feed(choice.text, final=True, incomplete=incomplete, logprobs=lps)
        final = body("incomplete" if output.incomplete else "completed")
        await keep(final)
        return final

    if req.background:
        return await core.background.start(body, finish)
    if req.stream:
        return stream_response(deltas, output, body, keep, logprobs_of)
    return await finish()
