"""The Responses API's response object, as it stands at each step of one response's life:
queued (background), in progress (streaming), and its end (completed, incomplete, failed or
cancelled), with the output items and usage once it is done."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from roundgate.deployment.openai.choices import Choice, usage
from roundgate.deployment.openai.responses_stream import OutputItems

if TYPE_CHECKING:
    from roundgate.deployment.openai.responses_request import ResponsesRequest

DONE = ("completed", "incomplete")


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
    """The response object of one request: ``body(status, error)`` is it at that status."""

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
        done = status in DONE
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if done else None,
            "status": status,
            "background": bool(req.background),
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
            "top_logprobs": req.top_logprobs,
            "text": req.text or {"format": {"type": "text"}},
            "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [],
            "truncation": "disabled",
            "usage": response_usage(self.choices) if done else None,
            "user": req.user,
            "metadata": req.metadata or {},
        }
