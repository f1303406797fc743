"""The prompt count a request asks for, checked before anything is parsed, rendered or
tokenized.

The ingress checks every limit again once the prompts are token ids
(``Ingress.check_choices``); these checks only move the count's refusal ahead of the work:
a body of 10,000 one-word prompts, or of 10,000 tiny conversations, fits ``max_request_bytes``
and would otherwise be tokenized or rendered in full before it was refused. The counts come
from the JSON as read (a completion's parsed fields, a batch's raw list), so they cost one
``len``.
"""

from __future__ import annotations

from typing import Any

from roundgate.deployment.openai.errors import APIError


def num_prompts_of(prompt: Any) -> int:
    """How many prompts a completion's ``prompt`` holds: a list of texts or of id lists is
    several; a text or one id list is one."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return len(prompt)
    return 1


def check_prompt_count(
    num_prompts: int, n: int, cap: int, param: str, noun: str = "prompts"
) -> None:
    """A 400 naming ``param`` and ``max_prompts_per_request`` when ``num_prompts`` (each with
    ``n`` choices) are more than one request may carry; the wording is the ingress's own
    (``noun``: what the request calls its prompts)."""
    if num_prompts > cap:
        raise APIError(
            400,
            f"{num_prompts} {noun} in one request; at most {cap} (max_prompts_per_request)",
            param=param,
        )
    if num_prompts * n > cap:
        raise APIError(
            400,
            f"{num_prompts} prompts x n={n} choices; at most {cap} (max_prompts_per_request)",
            param="n",
        )
