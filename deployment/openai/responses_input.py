"""The Responses API's ``input``, ``tools``, ``tool_choice`` and ``text`` in the chat
request's terms: the translation ``roundgate.deployment.openai.responses`` runs before the chat
path.

Each mistake is a 400 naming the Responses field (``input.3.content.1``, ``tools.0``), never
the chat field it would have become.
"""

from __future__ import annotations

from typing import Any

from roundgate.deployment.openai.errors import APIError

TEXT_PARTS = ("input_text", "output_text", "text")


def _text_of(content: object, where: str) -> str:
    """A message's content (a string or text parts) as its text; a 400 naming the part."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where}: must be a string or a list of text parts", param="input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise APIError(
                400,
                f"{where}.{j}: only text parts ({', '.join(TEXT_PARTS)}) are supported, "
                f"got {kind!r}",
                param="input",
            )
        texts.append(part["text"])
    return "".join(texts)


def _need_str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise APIError(400, f"{where}.{key}: must be a string", param="input")
    return value


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` as chat messages: text is one user message; a ``function_call`` joins the
    assistant message before it (as a chat message's ``tool_calls``); a
    ``function_call_output`` is a ``tool`` message. Output items of an earlier response
    (messages with ``id`` and ``status``) are accepted as input, as OpenAI does."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = _need_str(item, "role", where)
            messages.append({"role": role, "content": _text_of(item.get("content"), where)})
        elif kind == "function_call":
            call = {
                "id": _need_str(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _need_str(item, "name", where),
                    "arguments": _need_str(item, "arguments", where),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _need_str(item, "call_id", where),
                    "content": _text_of(output, f"{where}.output"),
                }
            )
        else:
            raise APIError(
                400,
                f"{where}: item type {kind!r} is not supported (message, function_call, "
                "function_call_output)",
                param="input",
            )
    return messages


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (``name`` at the top) in the chat shape (under
    ``function``); any other tool type (hosted search, code, ...) is a 400 naming it."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(
                400,
                f"tools.{i}: only function tools are supported, got type {tool.get('type')!r}",
                param="tools",
            )
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """``{'type': 'function', 'name': f}`` in the chat shape; strings pass as they are."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise APIError(
            400,
            "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": choice["name"]}}


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (None for plain text)."""
    if text is None:
        return None
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown or text.get("verbosity") is not None:
        name = unknown[0] if unknown else "verbosity"
        raise APIError(400, f"text.{name} is not supported by roundgate", param="text")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text" and len(fmt) == 1):
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        raise APIError(
            400, "text.format.type must be 'text', 'json_object' or 'json_schema'", param="text"
        )
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {k: v for k, v in fmt.items() if k != "type"}
    return {"type": "json_schema", "json_schema": schema}
