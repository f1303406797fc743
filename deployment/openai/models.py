"""``/v1/models``: the one model this deployment serves, under its served name."""

from __future__ import annotations

from typing import Any

from deployment.ingress import Ingress


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
