"""``/v1/completions``: prompts (text, texts, token ids) in, one choice per prompt and ``n``."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from roundgate.actors.model.tokenizer import Tokenizer
from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.beam_search import beam_search_choices, check_beam_request, drained
from roundgate.deployment.openai.choices import Choice, Delta, token_ids_of, usage
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.logprobs import (
    EchoedPrompt,
    completion_logprobs,
    logprob_texts,
    vllm_prompt_logprobs,
)
from roundgate.deployment.openai.prompt_limits import check_prompt_count, num_prompts_of
from roundgate.deployment.openai.protocol import CompletionRequest
from roundgate.deployment.openai.sse import drain, stream
from roundgate.deployment.serve_context import new_request_id


async def create_completion(
    core: Ingress, request: Request, body: object | None = None
) -> dict[str, Any] | StreamingResponse:
    """The route's body: each prompt's ids, one rank request per prompt, the answer
    (``body``: the JSON when ``/invocations`` has read it already)."""
    req = await core.read_request(request, CompletionRequest, body)
    # Counted before any prompt is tokenized; tokenized on a prepare thread, off the loop that
    # drives this replica's other streams (``roundgate.deployment.openai.prepare``).
    cap = core.app_args.max_prompts_per_request
    check_prompt_count(num_prompts_of(req.prompt), req.n, cap, "prompt")
    prompts = [
        req.truncated(ids) for ids in await core.prepare.run(prompt_ids, req, core.tokenizer)
    ]
    # ``max_tokens: 0`` scores the prompt: the rank generates one token, which is dropped.
    max_tokens = 1 if req.max_tokens == 0 else (req.max_tokens or 16)
    rid, created = new_request_id(), int(time.time())
    check_beam_request(req)
    if req.use_beam_search:
        choices = await beam_search_choices(core, rid, prompts, req, max_tokens, "prompt")
        deltas = drained()
    else:
        choices, deltas = core.generate_each(rid, prompts, req, max_tokens, "prompt")
    # After ``generate_each``'s checks: an id outside the vocabulary is a 400, not a decode error.
    echoes = await core.prepare.run(echo_texts, req, prompts, core.tokenizer) if req.echo else None
    texts = core.token_texts
    named = logprob_texts(texts, req.return_tokens_as_token_ids)  # how logprobs name tokens

    def logprobs(c: Choice, d: Delta | None) -> dict[str, Any] | None:
        """Delta ``d``'s logprobs (streamed), else the whole choice's; with ``echo`` the
        prompt's come first (in the first delta)."""
        if req.logprobs is None:
            return None
        ids, lps, offsets = (
            (c.output_token_ids, c.logprobs, c.text_offsets)
            if d is None
            else (d.token_ids, d.logprobs or [], d.text_offsets or [])
        )
        prompt = None
        if echoes is not None and (d is None or d.index not in echoed):
            echo = echoes[c.index // req.n]
            prompt = EchoedPrompt(
                c.prompt_token_ids, c.prompt_logprobs or [], req.logprobs, len(echo)
            )
        return completion_logprobs(named, ids, lps, offsets, prompt)

    def extras(c: Choice) -> dict[str, Any]:
        out = token_ids_of(c, req.return_token_ids)
        out["prompt_logprobs"] = None  # present, as vLLM's choices carry it, null unless asked
        if req.prompt_logprobs is not None:
            out["prompt_logprobs"] = vllm_prompt_logprobs(
                texts, c.prompt_token_ids, c.prompt_logprobs or [], req.prompt_logprobs
            )
        return out

    head = {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        "created": created,
        "model": core.model_name,
    }
    echoed: set[int] = set()
    if req.stream:

        def chunk(d: Delta) -> dict[str, Any]:
            c = choices[d.index]
            text = d.text
            delta: dict[str, Any] = {"index": d.index, "text": text, "logprobs": logprobs(c, d)}
            if echoes is not None and d.index not in echoed:
                echoed.add(d.index)
                delta["text"] = echoes[d.index // req.n] + text  # n choices per prompt
            delta["finish_reason"] = d.finish_reason
            if req.return_token_ids:  # each chunk's new ids (a session client resends them)
                delta["token_ids"] = d.token_ids
                if d.index not in started:  # the prompt's ids once, in the first chunk (vLLM)
                    delta["prompt_token_ids"] = c.prompt_token_ids
            started.add(d.index)
            return {**head, "choices": [delta]}

        started: set[int] = set()
        return stream(deltas, chunk, head, choices, req.stream_options)
    await drain(deltas)
    return {
        **head,
        "choices": [
            {
                "index": c.index,
                "text": c.text if echoes is None else echoes[c.index // req.n] + c.text,
                "logprobs": logprobs(c, None),
                "finish_reason": c.finish_reason,
                **extras(c),
            }
            for c in choices
        ],
        "usage": usage(choices),
        "system_fingerprint": None,  # vLLM's key, null
    }


# vLLM's wording, which clients match on (roundgate takes no ``prompt_embeds``).
EMPTY_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty."


def prompt_ids(req: CompletionRequest, tokenizer: Tokenizer) -> list[list[int]]:
    """Each prompt's token ids (texts tokenized, ids as sent), or a 400 for a missing or empty
    one.

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
        raise APIError(400, EMPTY_PROMPT, param="prompt")
    return prompts


def echo_texts(req: CompletionRequest, prompts: list[list[int]], tokenizer: Tokenizer) -> list[str]:
    """What ``echo`` puts before each choice's text: the prompt as sent; token ids as their
    text with special tokens kept (as vLLM, and the tokenizer's own ``decode``, write them: a
    prompt of special tokens echoes as their text, not as nothing)."""
    p = req.prompt
    if isinstance(p, str):
        return [p]
    if p and all(isinstance(x, str) for x in p):
        return list(p)
    return [tokenizer.decode(ids, skip_special_tokens=False) for ids in prompts]
