"""``/v1/chat/completions``: messages rendered by the model's template, the answer's body and
stream chunks (content, tool calls, logprobs, finish)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from actors.control.request import TokenLogprobs
from actors.model.tokenizer import Tokenizer
from deployment.ingress import Ingress
from deployment.openai.choices import Choice, Delta, token_ids_of, usage
from deployment.openai.errors import APIError
from deployment.openai.logprobs import TokenTexts, chat_logprobs
from deployment.openai.protocol import ChatMessage, ChatRequest
from deployment.openai.sse import drain, stream
from deployment.openai.tool_calls import ToolStream, parse_calls, render_inputs
from deployment.serve_context import http_request_id


async def create_chat_completion(
    core: Ingress, request: Request
) -> dict[str, Any] | StreamingResponse:
    """The route's body: the chat's prompt ids, one rank request, the answer."""
    req = await core.read_request(request, ChatRequest)
    ids = chat_prompt_ids(core.tokenizer, req.messages, req.tools)
    max_tokens = req.max_completion_tokens or req.max_tokens
    rid, created = http_request_id(), int(time.time())
    choices, deltas = core.generate(rid, ids, req, max_tokens, "messages")
    head = {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": core.model_name,
    }
    responder = ChatResponder(head, req, core.token_texts)
    if req.stream:
        options = req.stream_options
        include_usage = bool(options and options.include_usage)
        return stream(deltas, responder.chunk, head, choices, include_usage)
    await drain(deltas)
    return responder.body(choices)


def chat_prompt_ids(
    tokenizer: Tokenizer, messages: list[ChatMessage], tools: list[dict[str, Any]] | None
) -> list[int]:
    """The ids the model's template renders ``messages`` (and ``tools``) to, with the
    generation prompt; a 400 naming ``messages`` when they cannot be rendered."""
    try:
        inputs = [m.as_template_input() for m in messages]
        template = getattr(tokenizer, "chat_template", None)
        return tokenizer.render_chat(*render_inputs(inputs, tools, template))
    except ValueError as exc:  # a non-text part, no template, or the template refused
        raise APIError(400, str(exc), param="messages") from None


class ChatResponder:
    """Builds one chat request's answer; with ``tools`` (and ``tool_choice`` not ``none``)
    Hermes-style ``<tool_call>`` blocks become ``tool_calls`` and the finish ``tool_calls``."""

    def __init__(self, head: dict[str, Any], req: ChatRequest, texts: TokenTexts) -> None:
        self.head = head
        self.req = req
        self.texts = texts
        self.parses_tools = bool(req.tools) and req.tool_choice != "none"
        self.tool_streams: dict[int, ToolStream] = {}
        self.started: set[int] = set()

    def _logprobs(self, ids: list[int], lps: list[TokenLogprobs] | None) -> dict[str, Any] | None:
        if lps is None or not self.req.logprobs:
            return None
        return chat_logprobs(self.texts, ids, lps)

    def chunk(self, d: Delta) -> dict[str, Any]:
        """One stream event for a delta of one choice."""
        delta: dict[str, Any] = {}
        if d.index not in self.started:
            self.started.add(d.index)
            delta["role"] = "assistant"
        finish = d.finish_reason
        if self.parses_tools:
            tools = self.tool_streams.setdefault(d.index, ToolStream())
            before = tools.num_calls
            content, calls = tools.feed(d.text, final=finish is not None)
            delta["content"] = content
            if calls:
                delta["tool_calls"] = [
                    {"index": before + k, **call} for k, call in enumerate(calls)
                ]
            if finish == "stop" and tools.num_calls:
                finish = "tool_calls"
        else:
            delta["content"] = d.text
        choice = {
            "index": d.index,
            "delta": delta,
            "logprobs": self._logprobs(d.token_ids, d.logprobs),
            "finish_reason": finish,
        }
        return {**self.head, "choices": [choice]}

    def _message(self, c: Choice) -> tuple[dict[str, Any], str | None]:
        if not self.parses_tools:
            return {"role": "assistant", "content": c.text}, c.finish_reason
        content, calls = parse_calls(c.text)
        if not calls:
            return {"role": "assistant", "content": c.text}, c.finish_reason
        finish = "tool_calls" if c.finish_reason == "stop" else c.finish_reason
        return {"role": "assistant", "content": content, "tool_calls": calls}, finish

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
        return {**self.head, "object": "chat.completion", "choices": out, "usage": usage(choices)}
