"""What a request's data is carried as: a value's shape, and the shapes it counts as.

The rules of the request-path tracer (``benchmarks/request_path.py``), which records the
shapes one chat completion's data takes from the HTTP body to the scheduler and back:

- A container is its elements: ``list[Choice]`` is ``Choice`` again and ``list[dict]`` is
  ``dict``, because holding several of a type adds no type a reader must learn; only a
  container of scalars is a shape of its own (``list[int]``: token ids), since scalars are not
  shapes. A named tuple is a record, not a container: ``TokenEvent`` counts as itself.
- Per-request telemetry (types of ``roundgate.deployment.request_metrics``: ``RequestTimer``) is not
the
  request's data: it counts tokens and times about the request, and nothing of the response or
  of the rank's work is built from it.
"""

from __future__ import annotations

from typing import Any

SCALARS = (int, float, str, bool, bytes, type(None))
# Per-request telemetry, not the request's data.
TELEMETRY_MODULES = ("roundgate.deployment.request_metrics",)
# The project's packages: their types are named bare, any other with its package.
PROJECT_MODULES = ("roundgate.deployment", "roundgate.actors", "roundgate.sim")


def is_container(value: Any) -> bool:
    """A list, tuple, set or dict; a named tuple is a record, not a container."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return False
    return isinstance(value, list | tuple | set | frozenset | dict)


def describe(value: Any) -> str:
    """A value's raw shape: its type, with a container's element types (``list[int]``)."""
    kind = type(value)
    name = kind.__qualname__
    module = kind.__module__
    if module not in ("builtins",) and not module.startswith(PROJECT_MODULES):
        name = f"{module.split('.')[0]}.{name}"
    if not is_container(value):
        return name
    if isinstance(value, dict):
        keys = sorted({describe(k) for k in list(value)[:8]})
        return f"{name}[{' | '.join(keys) or '?'}, ...]"
    inner = sorted({describe(v) for v in list(value)[:8]})
    return f"{name}[{' | '.join(inner)}]" if inner else f"{name}[]"


def counted(value: Any) -> set[str]:
    """The shapes a value counts as (the rules above): a container counts as its non-scalar
    elements, or as itself when it holds only scalars; telemetry counts as none."""
    if type(value).__module__.startswith(TELEMETRY_MODULES):
        return set()
    if not is_container(value) or isinstance(value, dict):
        return {describe(value)}
    items = list(value)[:8]
    if all(isinstance(v, SCALARS) for v in items):
        return {describe(value)}
    return {s for v in items if not isinstance(v, SCALARS) for s in counted(v)}
