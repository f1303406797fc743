"""``/v1/models`` (the one model this deployment serves, under its served name) and
``/version`` (the server's version, as vLLM and SGLang serve it)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from roundgate.deployment.ingress import Ingress


def list_models(core: Ingress) -> dict[str, Any]:
    """OpenAI's model list, with vLLM's ``max_model_len`` (the context length)."""
    return {
        "object": "list",
        "data": [
            {
                "id": core.model_name,
                "object": "model",
                "created": 0,
                "owned_by": "roundgate",
                "max_model_len": core.max_model_len,
            }
        ],
    }


def server_version() -> dict[str, str]:
    """``{"version": ...}``: the installed ``roundgate`` package's version."""
    try:
        return {"version": version("roundgate")}
    except PackageNotFoundError:  # run from a checkout that was never installed
        return {"version": "unknown"}
