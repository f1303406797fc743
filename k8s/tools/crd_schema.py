"""Validate custom resources offline against the openAPIV3Schema of their CRD.

What the API server does before it stores a custom resource, as far as a JSON Schema validator
can follow it:

1. prune ``null`` values of fields that are not ``nullable``;
2. apply ``default`` values to missing fields (so a ``required`` field that has a default is
   not reported missing);
3. validate against the structural schema (``nullable`` becomes a ``null`` type here).

``strict=True`` additionally rejects unknown fields, as ``kubectl create --validate=strict``
does: every schema node with ``properties`` and without ``x-kubernetes-preserve-unknown-fields``
gets ``additionalProperties: false``. Not checked: CEL rules (``x-kubernetes-validations``) and
``metadata`` beyond it being an object (the CRD schema says no more).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

PRESERVE = "x-kubernetes-preserve-unknown-fields"


def load_crd(path: Path) -> dict[str, Any]:
    """The CRD document (libyaml loader when present: the KubeRay CRDs are ~1 MB each)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=loader)


def served_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    """``openAPIV3Schema`` of the served ``version``; ``ValueError`` if it is not served."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version and entry.get("served"):
            return entry["schema"]["openAPIV3Schema"]
    raise ValueError(f"{crd['metadata']['name']} does not serve version {version}")


def to_json_schema(schema: dict[str, Any], *, strict: bool) -> dict[str, Any]:
    """A JSON Schema copy: ``nullable`` mapped to a null type; unknown fields closed if strict."""
    out = copy.deepcopy(schema)
    _convert(out, strict)
    return out


def _convert(node: Any, strict: bool) -> None:
    if isinstance(node, list):
        for item in node:
            _convert(item, strict)
        return
    if not isinstance(node, dict):
        return
    if node.pop("nullable", False) and isinstance(node.get("type"), str):
        node["type"] = [node["type"], "null"]
    if strict and "properties" in node and not node.get(PRESERVE):
        node.setdefault("additionalProperties", False)
    for key, value in node.items():
        if key != "default":
            _convert(value, strict)


def prepare(obj: Any, schema: dict[str, Any]) -> Any:
    """A copy with non-nullable nulls pruned and defaults filled in, like the API server."""
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out = {}
        for key, value in obj.items():
            sub = props.get(key, extra if isinstance(extra, dict) else {})
            if value is None and not sub.get("nullable"):
                continue
            out[key] = prepare(value, sub)
        for key, sub in props.items():
            if key not in out and "default" in sub:
                out[key] = prepare(copy.deepcopy(sub["default"]), sub)
        return out
    if isinstance(obj, list):
        return [prepare(item, schema.get("items", {})) for item in obj]
    return obj


def format_path(parts: Any) -> str:
    """``spec.workerGroupSpecs[0].template`` from a jsonschema path deque."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"


class CrdValidator:
    """Validates objects of one CRD version; build once per CRD, the schemas are large."""

    def __init__(self, crd: dict[str, Any], version: str = "v1") -> None:
        self.group = crd["spec"]["group"]
        self.kind = crd["spec"]["names"]["kind"]
        self.version = version
        self.schema = served_schema(crd, version)
        self._validators = {
            strict: jsonschema.Draft7Validator(to_json_schema(self.schema, strict=strict))
            for strict in (False, True)
        }

    def errors(self, obj: dict[str, Any], *, strict: bool = True) -> list[str]:
        """Every problem as ``path: message``; empty when the object would be accepted."""
        expected = f"{self.group}/{self.version}"
        if obj.get("apiVersion") != expected or obj.get("kind") != self.kind:
            return [f"<root>: expected {expected} {self.kind}, got {obj.get('apiVersion')} "]
        problems = []
        for error in self._validators[strict].iter_errors(prepare(obj, self.schema)):
            path = format_path(error.absolute_path)
            if error.validator == "additionalProperties" and isinstance(error.instance, dict):
                known = error.schema.get("properties", {})
                for key in sorted(set(error.instance) - set(known)):
                    problems.append(f"{path}.{key}: unknown field")
            else:
                problems.append(f"{path}: {error.message}")
        return sorted(problems)
