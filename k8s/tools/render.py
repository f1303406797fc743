"""Render a kustomization the way ``kubectl kustomize`` would, for the subset this repo uses.

kubectl is not available where the tests run, so the tests render overlays with this. The subset
is deliberately small and anything outside it is an error rather than silently skipped, so a
manifest that renders here renders the same under kustomize:

- ``resources``: YAML files (one or more documents) or directories holding a kustomization;
- ``images``: ``name`` -> ``newName``/``newTag``/``digest`` on every ``containers`` and
  ``initContainers`` entry at any depth (kustomize does the same for custom resources);
- ``patches``: JSON6902 operations (``add``, ``remove``, ``replace``, ``test``) from ``path`` or
  inline ``patch``, with a ``target`` selecting ``kind`` and optionally ``name``.

Usage: ``python -m k8s.tools.render k8s/overlays/h200-dp8/serve``.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "images", "patches"}
IMAGE_KEYS = {"name", "newName", "newTag", "digest"}
TARGET_KEYS = {"kind", "name"}


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document in ``path``."""
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects a kustomization directory produces, in resource order."""
    kustomization = _load_kustomization(directory)
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        objects += render(target) if target.is_dir() else load_documents(target)
    for image in kustomization.get("images", []):
        _check_keys(image, IMAGE_KEYS, f"{directory}: images entry")
        for obj in objects:
            _set_images(obj, image)
    for number, patch in enumerate(kustomization.get("patches", [])):
        _apply_patch_entry(directory, number, patch, objects)
    return objects


def _load_kustomization(directory: Path) -> dict[str, Any]:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise ValueError(f"{directory}: no kustomization.yaml")
    docs = load_documents(path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ValueError(f"{path}: expected one mapping")
    _check_keys(docs[0], KUSTOMIZATION_KEYS, str(path))
    return docs[0]


def _check_keys(mapping: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise ValueError(f"{where}: unsupported keys {unknown} (this renderer knows {allowed})")


def _containers(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def _set_images(obj: dict[str, Any], image: dict[str, str]) -> None:
    for container in _containers(obj):
        current = str(container.get("image", ""))
        name = current.split("@", 1)[0]
        last = name.rsplit("/", 1)[-1]
        if ":" in last:
            name = name[: name.rindex(":")]
        if name != image["name"]:
            continue
        new = image.get("newName", name)
        if "digest" in image:
            new += "@" + image["digest"]
        elif "newTag" in image:
            new += ":" + str(image["newTag"])
        elif current != name:
            new += current[len(name) :]
        container["image"] = new


def _apply_patch_entry(
    directory: Path, number: int, entry: dict[str, Any], objects: list[dict[str, Any]]
) -> None:
    where = f"{directory}: patches[{number}]"
    _check_keys(entry, {"path", "patch", "target"}, where)
    if ("path" in entry) == ("patch" in entry):
        raise ValueError(f"{where}: give exactly one of path or patch")
    if "path" in entry:
        docs = load_documents(directory / entry["path"])
        operations = docs[0] if docs else []
    else:
        operations = yaml.safe_load(entry["patch"])
    if not isinstance(operations, list):
        raise ValueError(f"{where}: only JSON6902 patches (a list of operations) are supported")
    target = entry.get("target") or {}
    _check_keys(target, TARGET_KEYS, f"{where}.target")
    if "kind" not in target:
        raise ValueError(f"{where}: target needs a kind")
    matched = [
        obj
        for obj in objects
        if obj.get("kind") == target["kind"]
        and target.get("name", obj["metadata"]["name"]) == obj["metadata"]["name"]
    ]
    if not matched:
        raise ValueError(f"{where}: target {target} matches no resource")
    for obj in matched:
        for op in operations:
            apply_operation(obj, op, where)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer must start with '/': {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def apply_operation(obj: dict[str, Any], op: dict[str, Any], where: str = "patch") -> None:
    """Apply one RFC 6902 operation in place (add, remove, replace, test)."""
    kind, path = op.get("op"), op.get("path", "")
    if kind not in ("add", "remove", "replace", "test"):
        raise ValueError(f"{where}: unsupported op {kind!r} at {path!r}")
    *parents, last = _pointer(path)
    node: Any = obj
    for part in parents:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError):
            raise ValueError(f"{where}: {kind} {path}: no {part!r} on the way") from None
    value = copy.deepcopy(op.get("value"))
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(index, value)
            return
        if not 0 <= index < len(node):
            raise ValueError(f"{where}: {kind} {path}: index out of range")
    elif kind != "add" and last not in node:
        raise ValueError(f"{where}: {kind} {path}: no such field")
    if kind == "remove":
        del node[int(last) if isinstance(node, list) else last]
    elif kind == "test":
        current = node[int(last)] if isinstance(node, list) else node[last]
        if current != value:
            raise ValueError(f"{where}: test {path}: {current!r} != {value!r}")
    else:
        node[int(last) if isinstance(node, list) else last] = value


def main(argv: list[str] | None = None) -> int:
    """Print the rendered documents of each given kustomization directory."""
    for directory in argv if argv is not None else sys.argv[1:]:
        yaml.safe_dump_all(render(Path(directory)), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
