"""Check a RayService ``serveConfigV2`` offline: Ray's own schema plus the typos it lets through.

``ray.serve.schema.ServeDeploySchema`` ignores unknown keys, so ``num_replica:`` or
``import_pth:`` would deploy with the default silently. Here every key at every level is compared
with the pydantic fields (and aliases) of the model that reads it, and the application ``args``
(a free-form dict to Ray) are checked by what ``roundgate.deployment.app:build_app`` validates them
with, the pydantic ``roundgate.deployment.config.AppArgs``.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from ray.serve.schema import ServeDeploySchema

from roundgate.actors.model.config import PRESETS
from roundgate.deployment.config import AppArgs  # the deployment's own args model decides


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Pydantic models a field holds directly, or as a list/optional of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def unknown_keys(data: Any, model: type[BaseModel], path: str) -> list[str]:
    """Keys of ``data`` that ``model`` does not define, recursing into nested models."""
    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    names = {name: name for name in fields} | {
        f.alias: name for name, f in fields.items() if f.alias
    }
    problems = []
    for key, value in data.items():
        if key not in names:
            problems.append(f"{path}.{key}: unknown key for {model.__name__}")
            continue
        for sub in _models_in(fields[names[key]].annotation):
            items = value if isinstance(value, list) else [value]
            for index, item in enumerate(items):
                where = f"{path}.{key}[{index}]" if isinstance(value, list) else f"{path}.{key}"
                problems += unknown_keys(item, sub, where)
            break
    return problems


def check_app_args(args: dict[str, Any], path: str) -> list[str]:
    """Problems with one application's ``args`` for ``roundgate.deployment.app:build_app``.

    The model files live on the cluster's volumes, not here: a ``model`` path this machine
    cannot see is checked as a preset stands in for it (and ``max_model_len`` against nothing),
    so everything else in the args is still validated.
    """
    model = args.get("model")
    if isinstance(model, str) and model not in PRESETS and not Path(model).exists():
        args = {k: v for k, v in args.items() if k not in ("model", "max_model_len")}
    try:
        AppArgs.model_validate(args)
    except ValidationError as exc:
        return [
            f"{'.'.join([path, *(str(p) for p in err['loc'])])}: {err['msg']}"
            for err in exc.errors()
        ]
    return []


def check_serve_config(text: str) -> list[str]:
    """Every problem with a ``serveConfigV2`` string; empty when it is good to deploy."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return [f"serveConfigV2: not YAML: {exc}"]
    if not isinstance(data, dict):
        return ["serveConfigV2: must be a mapping"]
    # Ray's schema, the typo walk and the args check each see problems the others miss, so
    # all three run and every problem is reported at once.
    problems = []
    try:
        ServeDeploySchema.model_validate(data)
    except ValidationError as exc:
        problems += [
            f"serveConfigV2.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            for err in exc.errors()
        ]
    problems += unknown_keys(data, ServeDeploySchema, "serveConfigV2")
    for index, app in enumerate(data.get("applications") or []):
        args = app.get("args") if isinstance(app, dict) else None
        if isinstance(args, dict):
            problems += check_app_args(args, f"serveConfigV2.applications[{index}].args")
    return problems
