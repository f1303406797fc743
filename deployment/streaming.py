"""What the routes share: streaming deltas as server-sent events, draining, echo and ids."""

from __future__ import annotations

from typing import Any

from fastapi.responses import StreamingResponse

from deployment.choices import usage
from deployment.http_api import sse
from deployment.protocol import APIError


def token_ids_of(choice: Any, req: Any) -> dict[str, Any]:
    if not req.return_token_ids:
        return {}
    return {"prompt_token_ids": choice.prompt_token_ids, "token_ids": choice.output_token_ids}


def echo_texts(req: Any, prompts: list[list[int]], tokenizer: Any) -> list[str]:
    """What ``echo`` puts before each choice's text: the prompt as sent, text or ids."""
    p = req.prompt
    if isinstance(p, str):
        return [p]
    if p and all(isinstance(x, str) for x in p):
        return list(p)
    return [tokenizer.decode(ids) for ids in prompts]


async def drain(deltas: Any) -> None:
    async for _ in deltas:
        pass


def stream(deltas: Any, chunk: Any, head: dict, choices: list, req: Any) -> StreamingResponse:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def body() -> Any:
        try:
            async for d in deltas:
                yield sse(chunk(d))
        except APIError as exc:
            # Headers are already sent: the error travels as a final event.
            yield sse(exc.body())
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage(choices)})
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")
