"""The Responses API's output: one choice's text as output items (an assistant message and
function calls) and the server-sent events that build them.

``OutputItems`` is fed the text as it streams; the non-streamed answer feeds it the whole text
once, so both answer the same items, texts and calls. Items appear in the order they start:
an assistant message opens at its first non-blank text and stays open to the end (text after
a tool call continues it), each function call is one item, announced whole when its
``<tool_call>`` block closes (the chat path's parser, ``roundgate.deployment.openai.tool_calls``).
"""

from __future__ import annotations

import itertools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from roundgate.deployment.openai.choices import Delta
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.tool_calls import ToolStream

Event = dict[str, Any]
logger = logging.getLogger(__name__)
# ``body(status, error)``: the response object as it stands (output and usage once done).
BodyOf = Callable[[str, dict[str, Any] | None], dict[str, Any]]


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_part(text: str, logprobs: list[Any] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


class OutputItems:
    """The output items of one answer and the events announcing them.

    ``parses_tools``: the request's tools are parsed out of the text (``tool_choice`` not
    ``none``); ``max_calls``: 1 with ``parallel_tool_calls: false`` (the first call only).
    """

    def __init__(self, parses_tools: bool, max_calls: int | None = None) -> None:
        self.items: list[dict[str, Any]] = []
        self.tools = ToolStream() if parses_tools else None
        self.max_calls = max_calls
        self.incomplete = False  # ended by max_output_tokens
        self.finished = False
        self._message: dict[str, Any] | None = None  # the open message item
        self._message_index = 0
        self._text = ""
        # With ``include`` logprobs: every token's, and those not yet sent with a delta.
        self._logprobs: list[Any] = []
        self._unsent_logprobs: list[Any] = []
        # Blank text before the message opens: it may only separate tool calls, and an item
        # of whitespace is noise; it opens the message together with the next real text.
        self._held = ""

    @property
    def text(self) -> str:
        return self._text

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [item for item in self.items if item["type"] == "function_call"]

    def feed(
        self,
        text: str,
        final: bool,
        incomplete: bool = False,
        logprobs: list[Any] | None = None,
    ) -> list[Event]:
        """Take the next text (and its tokens' logprobs, when asked for); the events it makes
        (with ``final``, those that end the items). A token's logprob goes out with the first
        message text at or after it: text held back (a tool call, blank text) holds it too."""
        if self.finished:
            return []
        if logprobs:
            self._logprobs += logprobs
            self._unsent_logprobs += logprobs
        content, calls = text, []
        if self.tools is not None:
            before = self.tools.num_calls
            content, calls = self.tools.feed(text, final=final)
            if self.max_calls is not None:
                calls = calls[: max(0, self.max_calls - before)]
        events: list[Event] = []
        if content:
            events += self._add_text(content)
        for call in calls:
            self._held = ""  # blank text around calls separates them: no message of its own
            events += self._add_call(call)
        if final:
            events += self._finish(incomplete)
        return events

    def _add_text(self, content: str) -> list[Event]:
        events: list[Event] = []
        if self._message is None:
            self._held += content
            if not self._held.strip():
                return []
            content, self._held = self._held, ""
            events += self._open_message()
        return [*events, self._delta(content)]

    def _delta(self, content: str) -> Event:
        assert self._message is not None  # opened by the caller
        self._text += content
        logprobs, self._unsent_logprobs = self._unsent_logprobs, []
        return {
            "type": "response.output_text.delta",
            "item_id": self._message["id"],
            "output_index": self._message_index,
            "content_index": 0,
            "delta": content,
            "logprobs": logprobs,
        }

    def _open_message(self) -> list[Event]:
        item = {
            "id": item_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        self._message, self._message_index = item, len(self.items)
        self.items.append(item)
        where = {"item_id": item["id"], "output_index": self._message_index}
        return [
            {"type": "response.output_item.added", "output_index": self._message_index,
             "item": dict(item, content=[])},
            {"type": "response.content_part.added", **where, "content_index": 0,
             "part": _text_part("")},
        ]  # fmt: skip

    def _add_call(self, call: dict[str, Any]) -> list[Event]:
        fn = call["function"]
        item = {
            "id": item_id("fc"),
            "type": "function_call",
            "call_id": call["id"],
            "name": fn["name"],
            "arguments": fn["arguments"],
            "status": "completed",
        }
        index = len(self.items)
        self.items.append(item)
        where = {"item_id": item["id"], "output_index": index}
        return [
            {"type": "response.output_item.added", "output_index": index,
             "item": dict(item, arguments="", status="in_progress")},
            {"type": "response.function_call_arguments.delta", **where,
             "delta": fn["arguments"]},
            {"type": "response.function_call_arguments.done", **where,
             "arguments": fn["arguments"]},
            {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
        ]  # fmt: skip

    def _finish(self, incomplete: bool) -> list[Event]:
        self.finished, self.incomplete = True, incomplete
        events: list[Event] = []
        if not self.items:  # nothing but blank text (or none): still one message
            held, self._held = self._held, ""
            events += self._open_message()
            if held:
                events.append(self._delta(held))
        item = self._message
        if item is None:
            return events
        part = _text_part(self._text, self._logprobs)
        item["content"] = [part]
        item["status"] = "incomplete" if incomplete else "completed"
        where = {"item_id": item["id"], "output_index": self._message_index}
        return [
            *events,
            {"type": "response.output_text.done", **where, "content_index": 0,
             "text": self._text, "logprobs": self._logprobs},
            {"type": "response.content_part.done", **where, "content_index": 0, "part": part},
            {"type": "response.output_item.done", "output_index": self._message_index,
             "item": dict(item)},
        ]  # fmt: skip

    def assistant_message(self) -> dict[str, Any]:
        """The answer as a chat message, for the next turn of the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self._text or None}
        calls = self.calls
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["call_id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        elif message["content"] is None:
            message["content"] = ""
        return message


def _error_of(exc: APIError) -> dict[str, Any]:
    return {"code": exc.code or exc.type, "message": exc.message}


def stream_response(
    deltas: AsyncIterator[Delta],
    output: OutputItems,
    body: BodyOf,
    on_done: Callable[[dict[str, Any]], Awaitable[None]],
    logprobs_of: Callable[[list[int], list[Any] | None], list[Any] | None],
) -> StreamingResponse:
    """The Responses event stream: ``response.created`` and ``response.in_progress``, the
    items' events as text arrives, then ``response.completed`` (``response.incomplete`` when
    ``max_output_tokens`` ended it). An error after the headers went out travels as an
    ``error`` event and ``response.failed``. ``on_done`` stores the final response (a store
    that fails it is logged: the client has its answer, a later GET of it is a 404);
    ``logprobs_of(token_ids, logprobs)``: a delta's logprobs in the Responses shape (None
    when not asked for)."""
    numbers = itertools.count()

    def sse(event: Event) -> str:
        event["sequence_number"] = next(numbers)
        return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"

    async def events() -> AsyncIterator[str]:
        yield sse({"type": "response.created", "response": body("in_progress", None)})
        yield sse({"type": "response.in_progress", "response": body("in_progress", None)})
        try:
            async for d in deltas:
                final = d.finish_reason is not None
                lps = logprobs_of(d.token_ids, d.logprobs)
                for event in output.feed(d.text, final, d.finish_reason == "length", lps):
                    yield sse(event)
        except APIError as exc:
            error = _error_of(exc)
            yield sse({"type": "error", **error, "param": exc.param})
            yield sse({"type": "response.failed", "response": body("failed", error)})
            return
        for event in output.feed("", final=True):  # a stream that ended without a finish
            yield sse(event)
        status = "incomplete" if output.incomplete else "completed"
        final_body = body(status, None)
        try:
            await on_done(final_body)
        except APIError as exc:
            logger.warning("streamed response %s not stored: %s", final_body["id"], exc.message)
        yield sse({"type": f"response.{status}", "response": final_body})

    return StreamingResponse(events(), media_type="text/event-stream")
