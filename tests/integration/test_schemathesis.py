"""Property-based fuzzing of the running deployment from its own OpenAPI document.

schemathesis reads ``/openapi.json`` (the request bodies are declared from the pydantic
models, see ``roundgate.deployment.openai.api.json_body``) and sends bodies that fit the schema and
bodies that break it. No answer may be a 5xx, and every 4xx must carry the OpenAI error body.

Generation is real work on a 2-core CPU, so each case is capped before it is sent: at most
4 new tokens and 4 prompts. That keeps the run near a minute without hiding a failure mode:
the caps only shrink values the schema already allows (context overflows, which are cheap
to refuse, are left alone).
"""

from __future__ import annotations

from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

MAX_NEW_TOKENS = 4
MAX_PROMPTS = 4
CONTEXT = 4096


def load_schema() -> Any:
    """The app's own OpenAPI document, as the deployment serves it (checked below).

    Loaded at collection time: schemathesis' fixture-based loader does not run on pytest 9.
    """
    import roundgate.deployment.app  # noqa: F401  (registers the routes on ``api``)
    from roundgate.deployment.openai.api import api

    loaded = schemathesis.openapi.from_dict(api.openapi())
    loaded.config.generation.update(
        modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], deterministic=True
    )
    return loaded


schema = load_schema()


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def cap_cost(body: Any, path: str = "") -> None:
    """Shrink generation work in place; leaves wrong types and context overflows as they are.
    The Responses API names its limit ``max_output_tokens``: a ``max_tokens`` added there
    would make every case a cheap 400 and leave the route unfuzzed."""
    if not isinstance(body, dict):
        return
    keys = (
        ("max_output_tokens",)
        if path.endswith("/responses")
        else ("max_tokens", "max_completion_tokens")
    )
    for key in keys:
        value = body.get(key)
        if isinstance(value, str) and value.isdigit():  # lax parsing (vLLM's) reads "9" as 9
            value = body[key] = int(value)
        if is_int(value) and MAX_NEW_TOKENS < value < CONTEXT:
            body[key] = MAX_NEW_TOKENS
    if all(body.get(key) is None for key in keys):
        body[keys[0]] = MAX_NEW_TOKENS  # unset or null: the rest of the context
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not all(is_int(t) for t in prompt):
        del prompt[MAX_PROMPTS:]


@schema.parametrize()
@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case, app) -> None:
    cap_cost(case.body, case.path)
    response = case.call(base_url=app.url, timeout=60)
    case.validate_response(response, checks=[not_a_server_error])
    if 400 <= response.status_code < 500:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, response.text


def test_the_served_document_is_the_fuzzed_one(app) -> None:
    served = httpx.get(f"{app.url}/openapi.json", timeout=30).json()
    assert served == schema.raw_schema


def test_the_deployment_is_healthy_after_fuzzing(app) -> None:
    r = httpx.post(f"{app.url}/v1/completions", json={"prompt": "ok", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
    for rank in (0, 1):
        stats = app.rank_call("stats_snapshot", rank)
        assert stats["error"] is None
        assert app.rank_call("check_pool", rank)
