"""The chat completion's body and stream chunks: content, tool calls, logprobs, finish."""

from __future__ import annotations

from typing import Any

from deployment.choices import usage
from deployment.generation import Choice, Delta
from deployment.responses import TokenTexts, chat_logprobs
from deployment.streaming import token_ids_of
from deployment.tools import ToolStream, parse_calls


class ChatResponder:
    """Builds one chat request's answer; with ``tools`` (and ``tool_choice`` not ``none``)
    Hermes-style ``<tool_call>`` blocks become ``tool_calls`` and the finish ``tool_calls``."""

    def __init__(self, head: dict[str, Any], req: Any, texts: TokenTexts) -> None:
        self.head = head
        self.req = req
        self.texts = texts
        self.parses_tools = bool(req.tools) and req.tool_choice != "none"
        self.tool_streams: dict[int, ToolStream] = {}
        self.started: set[int] = set()

    def _logprobs(self, ids: Any, lps: Any) -> Any:
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
                    **token_ids_of(c, self.req),
                }
            )
        return {**self.head, "object": "chat.completion", "choices": out, "usage": usage(choices)}
