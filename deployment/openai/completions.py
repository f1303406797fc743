"""``/v1/completions``: prompts (text, texts, token ids) in, one choice per prompt and ``n``."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from actors.control.request import TokenLogprobs
from actors.model.tokenizer import Tokenizer
from deployment.ingress import Ingress
from deployment.openai.choices import Delta, token_ids_of, usage
from deployment.openai.errors import APIError
from deployment.openai.logprobs import completion_logprobs
from deployment.openai.protocol import CompletionRequest
from deployment.openai.sse import drain, stream
from deployment.serve_context import http_request_id


async def create_completion(core: Ingress, request: Request) -> dict[str, Any] | StreamingResponse:
    """The route's body: each prompt's ids, one rank request per prompt, the answer."""
    req = await core.read_request(request, CompletionRequest)
    if req.echo and req.logprobs is not None:
        raise APIError(
            400, "echo with logprobs needs prompt logprobs, which are not computed", "echo"
        )
    prompts = prompt_ids(req, core.tokenizer)
    texts = core.token_texts

    def logprobs(
        ids: list[int], lps: list[TokenLogprobs] | None, offsets: list[int] | None
    ) -> dict[str, Any] | None:
        if lps is None or offsets is None:
            return None
        return completion_logprobs(texts, ids, lps, offsets)

    rid, created = http_request_id(), int(time.time())
    choices, deltas = core.generate_each(rid, prompts, req, req.max_tokens or 16, "prompt")
    # After ``generate_each``'s checks: an id outside the vocabulary is a 400, not a decode error.
    echoes = echo_texts(req, prompts, core.tokenizer) if req.echo else None
    head = {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        "created": created,
        "model": core.model_name,
    }
    if req.stream:
        echoed: set[int] = set()

        def chunk(d: Delta) -> dict[str, Any]:
            text = d.text
            if echoes is not None and d.index not in echoed:
                echoed.add(d.index)
                text = echoes[d.index // req.n] + text  # n choices per prompt
            delta: dict[str, Any] = {
                "index": d.index,
                "text": text,
                "logprobs": logprobs(d.token_ids, d.logprobs, d.text_offsets),
                "finish_reason": d.finish_reason,
            }
            if req.return_token_ids:  # each chunk's new ids (a session client resends them)
                delta["token_ids"] = d.token_ids
            return {**head, "choices": [delta]}

        options = req.stream_options
        return stream(deltas, chunk, head, choices, bool(options and options.include_usage))
    await drain(deltas)
    return {
        **head,
        "choices": [
            {
                "index": c.index,
                "text": c.text if echoes is None else echoes[c.index // req.n] + c.text,
                "logprobs": logprobs(
                    c.output_token_ids,
                    c.logprobs if req.logprobs is not None else None,
                    c.text_offsets,
                ),
                "finish_reason": c.finish_reason,
                **token_ids_of(c, req.return_token_ids),
            }
            for c in choices
        ],
        "usage": usage(choices),
    }


def prompt_ids(req: CompletionRequest, tokenizer: Tokenizer) -> list[list[int]]:
    """Each prompt's token ids (texts tokenized, ids as sent), or a 400 for an empty one.

    Their limits (count, vocabulary, context length) are the ingress's to check."""
    p = req.prompt
    if isinstance(p, str):
        prompts = [tokenizer.encode(p)]
    elif p and all(isinstance(x, str) for x in p):
        prompts = [tokenizer.encode(x) for x in p]
    elif p and all(isinstance(x, int) for x in p):
        prompts = [list(p)]
    elif p and all(isinstance(x, list) for x in p):
        prompts = [list(x) for x in p]
    else:
        prompts = []
    if not prompts or any(not ids for ids in prompts):
        raise APIError(400, "prompt must not be empty", param="prompt")
    return prompts


def echo_texts(req: CompletionRequest, prompts: list[list[int]], tokenizer: Tokenizer) -> list[str]:
    """What ``echo`` puts before each choice's text: the prompt as sent, text or ids."""
    p = req.prompt
    if isinstance(p, str):
        return [p]
    if p and all(isinstance(x, str) for x in p):
        return list(p)
    return [tokenizer.decode(ids) for ids in prompts]
