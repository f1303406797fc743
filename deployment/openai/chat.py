"""``/v1/chat/completions``: messages rendered by the model's template, the answer's body and
stream chunks (content, tool calls, logprobs, finish)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from roundgate.actors.control.request import TokenLogprobs
from roundgate.actors.model.tokenizer import ChatOptions, Tokenizer
from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.beam_search import beam_search_choices, check_beam_request, drained
from roundgate.deployment.openai.choices import Choice, Delta, token_ids_of, usage
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.logprobs import (
    TokenTexts,
    chat_logprobs,
    logprob_texts,
    vllm_prompt_logprobs,
)
from roundgate.deployment.openai.protocol import ChatMessage, ChatRequest
from roundgate.deployment.openai.sse import drain, stream
from roundgate.deployment.openai.tool_calls import ToolStream, parse_calls, render_inputs
from roundgate.deployment.serve_context import new_request_id


async def create_chat_completion(
    core: Ingress, request: Request, body: object | None = None
) -> dict[str, Any] | StreamingResponse:
    """The route's body: the chat's prompt ids, one rank request, the answer (``body``: the
    JSON when ``/invocations`` has read it already)."""
    req = await core.read_request(request, ChatRequest, body)
    # ``tool_choice: none``: the tools are neither rendered nor parsed.
    tools = None if req.tool_choice == "none" else req.tools
    # Rendered on a prepare thread: a Jinja render holds whatever thread runs it, and the
    # loop drives every other stream of this replica (``roundgate.deployment.openai.prepare``).
    rendered = await core.prepare.run(
        chat_prompt_ids, core.tokenizer, req.messages, tools, chat_options(req)
    )
    ids = req.truncated(rendered)
    max_tokens = req.max_completion_tokens or req.max_tokens
    rid, created = new_request_id(), int(time.time())
    check_beam_request(req)
    if req.use_beam_search:
        room = core.max_model_len - len(ids)
        choices = await beam_search_choices(core, rid, [ids], req, max_tokens or room, "messages")
        deltas = drained()
    else:
        choices, deltas = core.generate(rid, ids, req, max_tokens, "messages")
    head = {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": core.model_name,
    }
    responder = ChatResponder(head, req, core.token_texts)
    responder.prompt_ids = {c.index: c.prompt_token_ids for c in choices}
    if req.stream:
        return stream(deltas, responder.chunk, head, choices, req.stream_options)
    await drain(deltas)
    return responder.body(choices)


def chat_options(req: ChatRequest) -> ChatOptions:
    """The request's rendering fields (vLLM's) as the tokenizer's ``ChatOptions``."""
    return ChatOptions(
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        template_kwargs=tuple((req.chat_template_kwargs or {}).items()),
    )


def chat_prompt_ids(
    tokenizer: Tokenizer,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    options: ChatOptions | None = None,
) -> list[int]:
    """The ids the model's template renders ``messages`` (and ``tools``) to, by default with
    the generation prompt; a 400 naming ``messages`` when they cannot be rendered."""
    try:
        inputs = [m.as_template_input() for m in messages]
        template = getattr(tokenizer, "chat_template", None)
        return tokenizer.render_chat(*render_inputs(inputs, tools, template), options)
    except ValueError as exc:  # a non-text part, no template, or the template refused
        raise APIError(400, str(exc), param="messages") from None


def answer_role(req: ChatRequest) -> str:
    """The answer's role, as vLLM: the assistant's after a generation prompt, else the last
    message's (the turn being continued)."""
    return "assistant" if req.add_generation_prompt else req.messages[-1].role


def echoed(req: ChatRequest) -> str:
    """What vLLM's ``echo`` puts before each answer: the last message's text when that message
    has the answer's role (``continue_final_message``: the turn continued), else nothing."""
    last = req.messages[-1]
    return last.text() if req.echo and last.role == answer_role(req) else ""


# A message's OpenAI keys roundgate never fills, sent as null as vLLM sends them.
UNUSED = {"refusal": None, "annotations": None, "audio": None, "function_call": None}


class ChatResponder:
    """Builds one chat request's answer; with ``tools`` (and ``tool_choice`` not ``none``)
    Hermes-style ``<tool_call>`` blocks become ``tool_calls`` and the finish ``tool_calls``.
    With ``echo``, each choice's content starts with ``echoed(req)`` (streamed: in the choice's
    first chunk), outside the tool-call parsing."""

    def __init__(self, head: dict[str, Any], req: ChatRequest, texts: TokenTexts) -> None:
        self.head = head
        self.req = req
        self.texts = texts
        self.role = answer_role(req)
        self.echo = echoed(req)
        self.parses_tools = bool(req.tools) and req.tool_choice != "none"
        # ``parallel_tool_calls: false``: the first call only.
        self.max_calls = 1 if req.parallel_tool_calls is False else None
        self.tool_streams: dict[int, ToolStream] = {}
        self.started: set[int] = set()
        self.prompt_ids: dict[int, list[int]] = {}  # by choice index, for the first chunk
        self.sent_prompt_ids = False

    def _logprobs(self, ids: list[int], lps: list[TokenLogprobs] | None) -> dict[str, Any] | None:
        if lps is None or not self.req.logprobs:
            return None
        return chat_logprobs(
            logprob_texts(self.texts, self.req.return_tokens_as_token_ids), ids, lps
        )

    def chunk(self, d: Delta) -> dict[str, Any]:
        """One stream event for a delta of one choice."""
        delta: dict[str, Any] = {}
        first = d.index not in self.started
        if first:
            self.started.add(d.index)
            delta["role"] = self.role
        finish = d.finish_reason
        if self.parses_tools:
            tools = self.tool_streams.setdefault(d.index, ToolStream())
            before = tools.num_calls
            content, calls = tools.feed(d.text, final=finish is not None)
            if self.max_calls is not None:
                calls = calls[: max(0, self.max_calls - before)]
            delta["content"] = content
            if calls:
                delta["tool_calls"] = [
                    {"index": before + k, **call} for k, call in enumerate(calls)
                ]
            if finish == "stop" and tools.num_calls:
                finish = "tool_calls"
        else:
            delta["content"] = d.text
        if first and self.echo:
            delta["content"] = self.echo + (delta["content"] or "")
        choice: dict[str, Any] = {
            "index": d.index,
            "delta": delta,
            "logprobs": self._logprobs(d.token_ids, d.logprobs),
            "finish_reason": finish,
        }
        event = {**self.head, "choices": [choice]}
        if self.req.return_token_ids:  # vLLM: the prompt's ids in the first chunk, then deltas
            if first:
                choice["prompt_token_ids"] = self.prompt_ids.get(d.index)
            if not self.sent_prompt_ids:  # and at the top of the stream's first chunk (vLLM)
                self.sent_prompt_ids = True
                event["prompt_token_ids"] = self.prompt_ids.get(d.index)
            choice["token_ids"] = d.token_ids
        return event

    def _message(self, c: Choice) -> tuple[dict[str, Any], str | None]:
        # vLLM's message keys, null when unused, and ``tool_calls`` an empty list without
        # calls (vLLM's default; the SDK's dump of the message then equals the raw JSON).
        message: dict[str, Any] = {
            "role": self.role,
            "content": self.echo + c.text,
            **UNUSED,
            "tool_calls": [],
        }
        if not self.parses_tools:
            return message, c.finish_reason
        content, calls = parse_calls(c.text)
        if self.max_calls is not None:
            calls = calls[: self.max_calls]
        if not calls:
            return message, c.finish_reason
        finish = "tool_calls" if c.finish_reason == "stop" else c.finish_reason
        if self.echo:
            content = self.echo + (content or "")
        return {**message, "content": content, "tool_calls": calls}, finish

    def body(self, choices: list[Choice]) -> dict[str, Any]:
        """The whole (non-streamed) answer."""
        out = []
        for c in choices:
            message, finish = self._message(c)
            out.append(
                {
                    "index": c.index,
                    "logprobs": self._logprobs(c.output_token_ids, c.logprobs),
                    "message": message,
                    "finish_reason": finish,
                    **token_ids_of(c, self.req.return_token_ids),
                }
            )
        body = {**self.head, "object": "chat.completion", "choices": out, "usage": usage(choices)}
        # vLLM's answer keys, null unless asked for; metadata and moderation are keys of the
        # openai SDK's ChatCompletion (3.x) that roundgate never fills.
        body.update(
            system_fingerprint=None,
            service_tier=None,
            metadata=None,
            moderation=None,
            prompt_logprobs=None,
        )
        asked = self.req.return_token_ids
        body["prompt_token_ids"] = choices[0].prompt_token_ids if asked else None
        k = self.req.prompt_logprobs
        if k is not None:  # vLLM's: the response's, one prompt for every choice
            first = choices[0]
            body["prompt_logprobs"] = vllm_prompt_logprobs(
                self.texts, first.prompt_token_ids, first.prompt_logprobs or [], k
            )
        return body
