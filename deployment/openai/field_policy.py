"""How a declared request field that roundgate does not implement is treated, and ``parse``,
which enforces it: no field is silently dropped when it would change the output.

- ``refused(what)``: an OpenAI field roundgate does not implement; a 400 naming it unless its
  value asks for nothing (each model's ``REFUSED`` says which values do).
- ``vllm_default(*accepts)``: one of vLLM's own fields roundgate does not implement; accepted
  only at the values that ask for nothing (vLLM's defaults), so a client that sends vLLM's full
  request (every field at its default) works, and refused by name at any other value.
- ``ignored(why)``: accepted and ignored, because it changes nothing in the output.

Each is marked in the OpenAPI document (``x-roundgate-supported``: ``false``, ``"default
only"`` with ``x-roundgate-accepts``, ``"ignored"``). docs/api.md states the policy.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from roundgate.deployment.openai.errors import APIError, describe_error

ACCEPTS = "x-roundgate-accepts"


def refused(what: str) -> Any:
    """A declared field roundgate does not implement (``what``: the values it accepts)."""
    return Field(
        None,
        description=f"Not supported: refused with a 400 unless {what}.",
        json_schema_extra={"x-roundgate-supported": False},
    )


def vllm_default(*accepts: Any) -> Any:
    """A vLLM field roundgate does not implement, accepted only at ``accepts`` (the values
    that ask for nothing; ``parse`` refuses any other with a 400 naming it)."""
    shown = " or ".join(json.dumps(a) for a in accepts)
    return Field(
        None,
        description=f"vendor (vLLM): not implemented; accepted only as {shown}",
        json_schema_extra={"x-roundgate-supported": "default only", ACCEPTS: list(accepts)},
    )


def ignored(description: str) -> Any:
    """A field accepted and ignored on purpose: it changes nothing in the output."""
    return Field(
        None,
        description=f"Accepted and ignored: {description}.",
        json_schema_extra={"x-roundgate-supported": "ignored"},
    )


def default_only(model: type[BaseModel]) -> dict[str, list[Any]]:
    """``model``'s ``vllm_default`` fields and the values each accepts."""
    out = {}
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra
        if isinstance(extra, dict) and ACCEPTS in extra:
            out[name] = list(extra[ACCEPTS])  # type: ignore[arg-type]
    return out


def _accepted(value: Any, accepts: list[Any]) -> bool:
    # ``type`` too: ``0 == False`` in Python, and ``priority: false`` is no priority of 0.
    return any(value == a and type(value) is type(a) for a in accepts if a is not None) or (
        value is None and None in accepts
    )


Body = TypeVar("Body", bound=BaseModel)


def parse(model: type[Body], body: object) -> Body:
    """``body`` (decoded JSON) as ``model``, or a 400 naming the first bad or refused field."""
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    try:
        req = model.model_validate(body)
    except ValidationError as exc:
        param, message = describe_error(exc)
        raise APIError(400, message, param=param) from None
    for name, accepts in getattr(model, "REFUSED", {}).items():
        if name in req.model_fields_set and not accepts(getattr(req, name)):
            raise APIError(400, f"{name} is not supported by roundgate", param=name)
    for name, values in default_only(model).items():
        value = getattr(req, name)
        if name in req.model_fields_set and not _accepted(value, values):
            shown = " or ".join(json.dumps(v) for v in values)
            raise APIError(
                400,
                f"{name}={json.dumps(value)} is not supported by roundgate: it would change the "
                f"output (accepted: {shown}, vLLM's default)",
                param=name,
            )
    check = getattr(req, "check_combinations", None)
    if check is not None:
        check()
    return req
