"""OpenAI fields that need translating into ``SamplingParams``, or a 400 naming them.

Structured output: ``response_format`` (``json_object``, ``json_schema``) and the vendor
fields ``guided_json``, ``guided_regex`` and ``guided_choice`` each become
``SamplingParams.grammar`` (compiled and enforced on the rank, see ``actors.model.grammar``);
at most one may be given.
"""

from __future__ import annotations

import json
from typing import Any

from deployment.api_errors import APIError
from deployment.protocol import CompletionRequest
from deployment.tools import tool_grammar


def grammar_of(req: Any) -> tuple[str, str] | None:
    """``(kind, spec)`` for the request's one structured-output field, or None."""
    given: list[tuple[str, tuple[str, str]]] = []
    fmt = getattr(req, "response_format", None)
    if fmt is not None and fmt.type == "json_object":
        given.append(("response_format", ("json_object", "")))
    elif fmt is not None and fmt.type == "json_schema":
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
        if schema is None:
            raise APIError(
                400, "response_format json_schema needs json_schema.schema", "response_format"
            )
        given.append(("response_format", ("json_schema", _dump(schema))))
    if req.guided_json is not None:
        given.append(("guided_json", ("json_schema", _dump(req.guided_json))))
    if req.guided_regex is not None:
        given.append(("guided_regex", ("regex", req.guided_regex)))
    if req.guided_choice is not None:
        given.append(("guided_choice", ("choice", json.dumps(req.guided_choice))))
    tool = tool_grammar(getattr(req, "tools", None), getattr(req, "tool_choice", None))
    if tool is not None:
        given.append(("tool_choice", tool))
    if len(given) > 1:
        names = ", ".join(name for name, _ in given)
        raise APIError(400, f"give at most one of {names}", param=given[1][0])
    return given[0][1] if given else None


def _dump(schema: dict[str, Any]) -> str:
    """One spelling per schema, so the rank's compiled-grammar cache sees equal schemas once."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def logit_bias_of(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` as ``(id, bias)`` pairs; a key that is no id is a 400."""
    if not bias:
        return ()
    pairs = []
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise APIError(
                400, f"logit_bias: key {key!r} is not a token id", param="logit_bias"
            ) from None
        pairs.append((token, value))
    if len({t for t, _ in pairs}) != len(pairs):
        raise APIError(400, "logit_bias: a token id appears twice", param="logit_bias")
    return tuple(pairs)


def logprobs_of(req: Any) -> int | None:
    """How many top logprobs a request wants per token (None: no logprobs at all)."""
    if isinstance(req, CompletionRequest):
        return req.logprobs
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None
