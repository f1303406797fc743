"""The HTTP surface the ingress serves through: the FastAPI app, its OpenAPI document, the
OpenAI error envelope for every refusal, and the JSON body reader.

Every client mistake is answered with a 4xx and an OpenAI-style error body, unknown paths and
wrong methods included.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.protocol import ChatRequest, CompletionRequest

logger = logging.getLogger("roundgate.api")
api = FastAPI(title="roundgate", version="0.1.0")
# Every route's body model (``json_body`` adds each route's), for the OpenAPI document.
BODY_MODELS: list[type[BaseModel]] = [CompletionRequest, ChatRequest]


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` declaring ``model`` as a route's JSON body.

    The routes read the raw body themselves (so every mistake gets an OpenAI-style 4xx, not
    FastAPI's 422); this keeps the request schema in the OpenAPI document for clients and
    fuzzers.
    """
    if model not in BODY_MODELS:
        BODY_MODELS.append(model)
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _openapi() -> dict[str, Any]:
    """FastAPI's document plus the request models behind ``json_body`` references."""
    if api.openapi_schema is None:
        doc = get_openapi(title=api.title, version=api.version, routes=api.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in BODY_MODELS:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        api.openapi_schema = doc
    return api.openapi_schema


api.openapi = _openapi  # type: ignore[method-assign]


@api.exception_handler(APIError)
async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


@api.exception_handler(Exception)
async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    """Anything no route turned into an ``APIError``: a 500 with the OpenAI error body and an
    id to find it in the log by (logged with its traceback), never a plain-text page."""
    incident = f"err-{uuid.uuid4().hex[:12]}"
    logger.error(
        "%s %s: unexpected %s (%s)",
        request.method,
        request.url.path,
        type(exc).__name__,
        incident,
        exc_info=exc,
    )
    message = f"internal error {incident} ({type(exc).__name__}); the server log has its trace"
    return JSONResponse(APIError(500, message, code="internal_error").body(), status_code=500)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Unknown paths and wrong methods get the OpenAI error body too."""
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return await _api_error(request, APIError(exc.status_code, message, headers=exc.headers))


# An oversized body is read to its end (and dropped) up to this size before the 413 goes out:
# a server that answers while the client is still sending resets the connection, and the
# client never sees the answer. Past it, the connection is closed regardless.
DRAIN_LIMIT_BYTES = 256 << 20


async def read_json(request: Request, max_bytes: int) -> object:
    """The body as JSON, or a 4xx naming what is wrong with it.

    A body declared as another media type (a form, plain text) is a 415 in vLLM's words, as
    vLLM refuses it; a body with no ``Content-Type`` at all is read as JSON."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type and media_type != "application/json":
        await _drain(request.stream(), 0)  # read before answering (see DRAIN_LIMIT_BYTES)
        raise APIError(
            415,
            "Unsupported Media Type: Only 'application/json' is allowed",
            code="unsupported_media_type",
        )
    too_large = APIError(413, f"request body exceeds {max_bytes} bytes", code="body_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        await _drain(request.stream(), 0)
        raise too_large
    chunks: list[bytes] = []
    size = 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > max_bytes:
            await _drain(stream, size)
            raise too_large
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"request body is not UTF-8 (byte {exc.start})") from None
    return parse_json_text(text, "request body")


# Python refuses to convert an integer string longer than this (``sys.int_info``'s default
# limit), with a ValueError that is no JSONDecodeError.
MAX_INT_DIGITS = 4300
# A ``\uD800``-``\uDFFF`` escape: the only way a lone surrogate gets into parsed JSON (UTF-8
# decoding refuses one in the raw bytes).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_constant(name: str) -> object:
    raise _NotJSON(f"{name} is not a JSON number")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _NotJSON(f"an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


class _NotJSON(ValueError):
    """Valid to Python's parser, refused here: NaN/Infinity, an integer past the limit."""


def parse_json_text(text: str, what: str, param: str | None = None) -> object:
    """``text`` parsed as strict JSON, or a 400 naming ``what`` and the problem: malformed,
    nested too deeply, ``NaN``/``Infinity`` (Python accepts them, JSON and every client that
    reads our echo of them do not), an integer longer than Python converts, or a string
    holding a lone surrogate (no tokenizer or encoder takes one). What parses is safe to echo,
    store and tokenize."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_int=_bounded_int)
    except _NotJSON as exc:
        raise APIError(400, f"{what}: invalid JSON: {exc}", param=param) from None
    except json.JSONDecodeError as exc:
        raise APIError(
            400,
            f"{what}: invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            param=param,
        ) from None
    except RecursionError:  # the parser recurses once per nesting level
        raise APIError(400, f"{what}: invalid JSON: nested too deeply", param=param) from None
    if _SURROGATE_ESCAPE.search(text):
        where = _lone_surrogate(value, "")
        if where is not None:
            path, index = where
            raise APIError(
                400,
                f"{what}: {path or 'the value'} holds a lone surrogate escape at character "
                f"{index} (UTF-16 halves must come in pairs)",
                param=param or path.split(".")[0].split("[")[0] or None,
            )
    return value


def _lone_surrogate(value: object, path: str) -> tuple[str, int] | None:
    """Where the first string holding a lone surrogate is (its path, the index), if any.
    Iterative: the body may be nested as deep as the parser allows."""
    todo: list[tuple[object, str]] = [(value, path)]
    while todo:
        item, at = todo.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found:
                return at, found.start()
        elif isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str) and _SURROGATE.search(key):
                    return at or "a key", 0
                todo.append((inner, f"{at}.{key}" if at else str(key)))
        elif isinstance(item, list):
            todo += [(inner, f"{at}[{i}]") for i, inner in enumerate(item)]
    return None


async def _drain(stream: AsyncIterator[bytes], seen: int) -> None:
    """Read and drop the rest of a body, up to ``DRAIN_LIMIT_BYTES`` in all."""
    async for chunk in stream:
        seen += len(chunk)
        if seen > DRAIN_LIMIT_BYTES:
            return
