"""Tool calling: tools rendered into the prompt, Hermes-style ``<tool_call>`` output parsed.

A template that knows tools (it reads ``tools``) renders them itself; for one that does not
(SmolLM2-135M's), the tools are listed in a system message in the Hermes wording the
Qwen2.5/SmolLM2 families were tuned on, and earlier assistant calls are written back as
``<tool_call>`` blocks, so the model sees what it called. Output ``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`` blocks become OpenAI ``tool_calls`` (streamed as one delta
per call, once the block closes). ``tool_choice`` ``"required"`` or a named function is
enforced with a grammar (one call, of the allowed tools, with arguments that follow the
tool's parameter schema); ``"none"`` renders the tools but parses no calls.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from typing import Any

from roundgate.deployment.openai.errors import APIError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    listed = "\n".join(json.dumps(t.get("function", t)) for t in tools)
    return (
        "You can call functions to help with the user's request. The functions, as JSON "
        f"signatures, are:\n<tools>\n{listed}\n</tools>\nTo call one, answer with a JSON object "
        "holding its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n"
        '{"name": <function name>, "arguments": <arguments object>}\n</tool_call>'
    )


def render_inputs(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, template: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(messages, tools)`` to hand the chat template (see the module doc)."""
    if not tools or (template is not None and "tools" in template):
        return messages, tools
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if m["role"] == "assistant" and calls:
            blocks = [
                f"{OPEN}\n{json.dumps(_call_json(c))}\n{CLOSE}"
                for c in calls
                if isinstance(c, dict) and isinstance(c.get("function"), dict)
            ]
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = "\n".join(filter(None, [m.get("content") or "", *blocks]))
        out.append(m)
    system = tools_system_text(tools)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{system}"}
    else:
        out.insert(0, {"role": "system", "content": system})
    return out, None


def _call_json(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    args = fn.get("arguments", "{}")
    with contextlib.suppress(json.JSONDecodeError):  # not JSON: the text as it was
        args = json.loads(args) if isinstance(args, str) else args
    return {"name": fn.get("name"), "arguments": args}


def _hoist_definitions(function: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters schema, its ``$defs`` moved to ``definitions`` (the call schema's
    root): pydantic writes nested models as ``#/$defs/Name`` references, which resolve from
    the root of the schema the grammar compiles, not from where the parameters sit in it."""
    parameters = function.get("parameters") or {"type": "object"}
    if not isinstance(parameters, dict) or "$defs" not in parameters:
        return parameters
    own = parameters["$defs"]
    if not isinstance(own, dict):
        raise APIError(400, "a tool's parameters.$defs must be an object", param="tools")
    for name, definition in own.items():
        if definitions.setdefault(name, definition) != definition:
            raise APIError(
                400,
                f"tools {function.get('name')!r} and another define $defs/{name} differently: "
                "with tool_choice 'required' their definitions share one namespace",
                param="tools",
            )
    return {k: v for k, v in parameters.items() if k != "$defs"}


def tool_grammar(
    tools: list[dict[str, Any]] | None, choice: str | dict[str, Any] | None
) -> tuple[str, str] | None:
    """The grammar ``tool_choice`` asks for (None for ``auto`` / ``none``), or a 400."""
    if choice in (None, "auto", "none"):
        return None
    if not tools:
        raise APIError(400, "tool_choice needs tools", param="tool_choice")
    functions = [t.get("function", {}) for t in tools]
    if choice != "required":
        wanted = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        functions = [f for f in functions if f.get("name") == wanted]
        if not isinstance(choice, dict) or choice.get("type") != "function" or not functions:
            raise APIError(
                400,
                "tool_choice must be 'none', 'auto', 'required' or "
                "{'type': 'function', 'function': {'name': <one of the tools>}}",
                param="tool_choice",
            )
    definitions: dict[str, Any] = {}
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f.get("name")},
                "arguments": _hoist_definitions(f, definitions),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    if definitions:
        schema = {**schema, "$defs": definitions}
    # Keys in the order written: the call comes out as {"name": ..., "arguments": ...} (the
    # format the model was tuned on) and the arguments in the tool's own property order.
    return ("tool_call", json.dumps(schema))


def parse_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content outside the calls or None, tool_calls)``; a block that is not a JSON call
    with a name stays in the content."""
    calls = []
    kept = []
    last = 0
    for match in _CALL.finditer(text):
        call = _as_call(match.group(1))
        if call is None:
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(call)
    if not calls:
        return text, []
    kept.append(text[last:])
    return "".join(kept).strip() or None, calls


def _as_call(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": json.dumps(args)},
    }


class ToolStream:
    """Streams content around tool-call blocks: text that may start a block is held back;
    a closed block goes out as one call."""

    def __init__(self) -> None:
        self.buffer = ""
        self.num_calls = 0

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """``(content to send, calls completed)`` after ``text`` arrived."""
        self.buffer += text
        content, calls = "", []
        while True:
            start = self.buffer.find(OPEN)
            if start < 0:
                break
            end = self.buffer.find(CLOSE, start)
            if end < 0:
                content += self.buffer[:start]
                self.buffer = self.buffer[start:]
                return (content + self.buffer if final else content), calls
            block = self.buffer[start : end + len(CLOSE)]
            _, parsed = parse_calls(block)
            content += self.buffer[:start] if parsed else self.buffer[: end + len(CLOSE)]
            calls += parsed
            self.num_calls += len(parsed)
            self.buffer = self.buffer[end + len(CLOSE) :]
        # Hold back a tail that could be the start of an opening tag.
        keep = 0 if final else _partial_prefix(self.buffer, OPEN)
        cut = len(self.buffer) - keep
        content, self.buffer = content + self.buffer[:cut], self.buffer[cut:]
        return content, calls


def _partial_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
