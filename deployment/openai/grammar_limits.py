"""How large a structured-output grammar the ingress lets through to a rank.

A grammar compiles on the rank before its request can run, and compile time grows faster than
the grammar (xgrammar, the default model's tokenizer: a JSON schema of 256 string properties
compiles in ~0.13 s, 512 in ~0.55 s, 1,024 in ~2.7 s). The rank bounds a compile in time
(``--max-grammar-compile-s``); these limits refuse the grammars that could never make it, with
a 400 naming the limit, before anything streams or reaches a rank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from roundgate.deployment.openai.errors import APIError


@dataclass(frozen=True)
class GrammarLimits:
    """The ingress's grammar limits (``AppArgs`` fields of the same names)."""

    max_grammar_bytes: int = 64 * 1024
    max_grammar_properties: int = 512
    max_grammar_depth: int = 64
    max_grammar_regex_chars: int = 4096
    max_grammar_ebnf_chars: int = 16 * 1024


def _shape(node: object, depth: int = 1) -> tuple[int, int]:
    """(object properties, JSON nesting levels) of a decoded JSON schema (each object and
    array is a level: a property's subschema sits two below its parent, under
    ``properties``). Walked with a stack: no recursion limit to hit."""
    properties, deepest = 0, depth
    stack = [(node, depth)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            for key in ("properties", "patternProperties"):
                if isinstance(item.get(key), dict):
                    properties += len(item[key])
            stack.extend((v, level + 1) for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item if isinstance(v, dict | list))
    return properties, deepest


def check_grammar(grammar: tuple[str, str], limits: GrammarLimits) -> None:
    """Refuse a grammar over the limits: ``APIError`` 400 naming the limit."""
    kind, spec = grammar
    size = len(spec.encode())
    if size > limits.max_grammar_bytes:
        _refuse(f"{kind}: {size} bytes; at most {limits.max_grammar_bytes} (max_grammar_bytes)")
    if kind == "regex" and len(spec) > limits.max_grammar_regex_chars:
        _refuse(
            f"regex: {len(spec)} characters; at most {limits.max_grammar_regex_chars} "
            "(max_grammar_regex_chars)"
        )
    if kind == "ebnf" and len(spec) > limits.max_grammar_ebnf_chars:
        _refuse(
            f"ebnf: {len(spec)} characters; at most {limits.max_grammar_ebnf_chars} "
            "(max_grammar_ebnf_chars)"
        )
    if kind in ("json_schema", "json_schema_open", "tool_call"):
        try:
            schema = json.loads(spec)
        except (ValueError, RecursionError):
            return  # not JSON (or absurdly nested): the rank's compile says what is wrong
        properties, depth = _shape(schema)
        if properties > limits.max_grammar_properties:
            _refuse(
                f"{kind}: {properties} object properties; at most "
                f"{limits.max_grammar_properties} (max_grammar_properties)"
            )
        if depth > limits.max_grammar_depth:
            _refuse(
                f"{kind}: nested {depth} levels deep; at most {limits.max_grammar_depth} "
                "(max_grammar_depth)"
            )


def _refuse(message: str) -> None:
    message = f"the structured-output grammar is too large: {message}"
    raise APIError(400, message, code="grammar_too_large")
