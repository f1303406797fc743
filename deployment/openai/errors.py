"""The OpenAI error envelope and the description of a body's first invalid field."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError


class APIError(Exception):
    """An error answered with an OpenAI-style body; never a 5xx for the client's mistake."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            413: "invalid_request_error",
            503: "service_unavailable",
        }.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def describe_error(exc: ValidationError) -> tuple[str | None, str]:
    """``(param, message)`` for the first invalid field, e.g. ``("max_tokens", "max_tokens: ...")``.

    A union field (``prompt``, ``stop``, a message's ``content``) fails once per accepted
    form, each error tagged with the form (``prompt.list[int].0``). When the value has the
    right type for exactly one form, that form's complaint is the message; otherwise the
    message names the accepted forms.
    """
    errors = exc.errors()
    first = errors[0]["loc"]
    param = str(first[0]) if first else None
    cut = next((i for i, p in enumerate(first) if _is_union_tag(p)), None)
    if errors[0]["type"] == "extra_forbidden":
        return param, f"{_dotted(first)}: unknown field (refused, not ignored)"
    if cut is None:
        return param, f"{_dotted(first) or 'body'}: {errors[0]['msg']}{_tag(errors[0])}"
    forms = [
        e
        for e in errors
        if len(e["loc"]) > cut and e["loc"][:cut] == first[:cut] and _is_union_tag(e["loc"][cut])
    ]
    # A wrong type (lax parsing's "cannot parse as an integer" included) rules a form out.
    near = [e for e in forms if not e["type"].endswith(("_type", "_parsing"))]
    if len(near) == 1:
        return param, f"{_dotted(near[0]['loc'])}: {near[0]['msg']}{_tag(near[0])}"
    names = ", ".join(dict.fromkeys(_form_name(str(e["loc"][cut])) for e in forms))
    return param, f"{_dotted(first)}: invalid type or value; expected one of {names}"


def _tag(error: Any) -> str:
    """pydantic's error type, as pydantic (and so vLLM) writes it: clients and test suites
    match on ``greater_than_equal`` and its kin."""
    return f" [type={error['type']}]"


def _is_union_tag(part: str | int) -> bool:
    """pydantic's name of a union member in an error location (``str``, ``list[int]``)."""
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool"} or "[" in part or "-" in part
    )


def _dotted(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if not _is_union_tag(p))


def _form_name(tag: str) -> str:
    """``list[function-before[_integral(), int]]`` -> ``list[int]``."""
    tag = re.sub(r"function-[a-z]+\[[^\[\]]*?, ([^\[\]]+)\]", r"\1", tag)
    return tag.replace("constrained-", "")
