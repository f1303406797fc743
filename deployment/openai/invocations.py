"""``POST /invocations``: SageMaker's single entry point, dispatched by the body's shape as
vLLM does: a body with ``messages`` is a chat completion, one with ``prompt`` a completion
(vLLM tries its request models in that order). Auth, limits, errors and streaming are the
target route's own; a body that is neither is a 400 in vLLM's wording.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.api import read_json
from roundgate.deployment.openai.chat import create_chat_completion
from roundgate.deployment.openai.completions import create_completion
from roundgate.deployment.openai.errors import APIError

HANDLERS = ("ChatCompletionRequest", "CompletionRequest")  # vLLM's names, in its order


async def invocations(core: Ingress, request: Request) -> Any:
    """The route's body: the key checked, the JSON read once, then the matching route."""
    core.check_auth(request)
    body = await read_json(request, core.app_args.max_request_bytes)
    if isinstance(body, dict) and "messages" in body:
        return await create_chat_completion(core, request, body)
    if isinstance(body, dict) and "prompt" in body:
        return await create_completion(core, request, body)
    raise APIError(
        400, f"Cannot find suitable handler for request. Expected one of: {list(HANDLERS)}"
    )
