"""``/v1/chat/completions/batch``: vLLM's batched chat, several conversations in one request.

The body is a chat request whose ``messages`` is a list of conversations; each is rendered by
the chat template and generated as one rank request (their limits checked together, up to
``max_prompts_per_request``), and the answer is one chat completion with a choice per
conversation, ``choices[i]`` for conversation ``i``. As in vLLM: no streaming, no tools, one
choice per conversation (``n: 1``); roundgate also refuses ``echo`` here (each conversation
would echo its own last turn).

The conversations are counted as soon as the JSON is read, and parsed and rendered on the
ingress's prepare threads (``roundgate.deployment.openai.prepare``): a body of thousands of
one-word conversations is refused before any of that work, and a legitimate batch's renders
never hold the loop that drives the replica's other streams.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request

from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.api import read_json
from roundgate.deployment.openai.chat import ChatResponder, chat_options, chat_prompt_ids
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.prompt_limits import check_prompt_count
from roundgate.deployment.openai.protocol import ChatRequest, parse
from roundgate.deployment.openai.sse import drain
from roundgate.deployment.serve_context import new_request_id

# Fields a batch refuses at anything but their default (vLLM's batch limits, and echo).
NOT_IN_A_BATCH = {"stream": False, "tools": None, "n": 1, "echo": False}


async def create_batch_chat_completion(core: Ingress, request: Request) -> dict[str, Any]:
    """The route's body: each conversation's prompt ids, one rank request each, one answer."""
    core.check_auth(request)
    body = await read_json(request, core.app_args.max_request_bytes)
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    conversations = body.get("messages")
    if isinstance(conversations, list):
        cap = core.app_args.max_prompts_per_request
        check_prompt_count(len(conversations), 1, cap, "messages", "conversations")
    if not (
        isinstance(conversations, list)
        and conversations
        and all(isinstance(c, list) and c for c in conversations)
    ):
        raise APIError(
            400,
            "messages must be a non-empty list of conversations, each a non-empty list of messages",
            param="messages",
        )
    for name, default in NOT_IN_A_BATCH.items():
        if body.get(name, default) not in (default, None):
            raise APIError(400, f"{name} is not supported by batched chat completions", name)
    first, prompts = await core.prepare.run(prepare_batch, core, body, conversations)
    rid, created = new_request_id(), int(time.time())
    max_tokens = first.max_completion_tokens or first.max_tokens
    choices, deltas = core.generate_each(rid, prompts, first, max_tokens, "messages")
    head = {"id": f"chatcmpl-{rid}", "created": created, "model": core.model_name}
    await drain(deltas)
    return ChatResponder(head, first, core.token_texts).body(choices)


def prepare_batch(
    core: Ingress, body: dict[str, Any], conversations: list[list[Any]]
) -> tuple[ChatRequest, list[list[int]]]:
    """The first conversation's request (its fields are the batch's) and every conversation's
    prompt ids: each parsed with the chat route's checks, message by message, and rendered.

    One call for the whole batch, on a prepare thread (the module doc says why one)."""
    reqs = [parse(ChatRequest, {**body, "messages": c}) for c in conversations]
    first = reqs[0]
    core.check_model(first.model)
    prompts = [
        req.truncated(chat_prompt_ids(core.tokenizer, req.messages, None, chat_options(req)))
        for req in reqs
    ]
    return first, prompts
