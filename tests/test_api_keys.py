"""API keys as vLLM takes them, through the real HTTP app on a fake rank (no Ray): several keys,
any one accepted; each compared in constant time with every configured key; one refusal (status
and body) on every protected route, whatever the route.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from ingress_fakes import APP_ARGS, FakeRanks, echo_reply
from vllm_http import App

from roundgate.actors.role import DisaggregationRole
from roundgate.deployment.config import AppArgs
from roundgate.deployment.ingress import Ingress

FUSED = DisaggregationRole.FUSED

KEYS = ["alpha-key", "beta-key"]
# Routes anyone may call: probes, the version, the load (vLLM protects only /v1 paths; these
# say nothing about the model or its users).
PUBLIC = {"/health", "/metrics", "/version", "/load"}
REFUSAL = {
    "error": {
        "message": "missing or wrong API key (Authorization: Bearer ...)",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> App:
    keyed = App(monkeypatch)
    keyed.core.api_keys = tuple(KEYS)  # as AppArgs(api_key=KEYS) resolves them
    return keyed


def protected_routes() -> list[tuple[str, str]]:
    """Every (method, path) of the app's OpenAPI document that is not public, path parameters
    filled in: a route added later is covered without listing it here."""
    import roundgate.deployment.app  # noqa: F401  (registers the routes)
    from roundgate.deployment.openai.api import api

    routes = []
    for path, operations in api.openapi()["paths"].items():
        if path not in PUBLIC:
            filled = re.sub(r"\{[^}]+\}", "x", path)
            routes += [(method.upper(), filled) for method in sorted(operations)]
    return routes


def call(app: App, method: str, path: str, headers: dict[str, str]) -> Any:
    body = {"messages": [{"role": "user", "content": "hi"}], "prompt": "ab", "max_tokens": 1}
    if method == "GET":
        return app.client.get(path, headers=headers)
    return app.client.request(method, path, content=json.dumps(body), headers=headers)


def test_the_protected_routes_include_every_generation_route() -> None:
    paths = {path for _, path in protected_routes()}
    assert {"/v1/completions", "/v1/chat/completions", "/invocations", "/v1/models"} <= paths


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer nope"}, {"authorization": "alpha-key"}, {"x-api-key": "beta"}],
    ids=["none", "wrong", "no-bearer", "other-header"],
)
def test_every_protected_route_refuses_alike(app, headers) -> None:
    for method, path in protected_routes():
        r = call(app, method, path, headers)
        assert (r.status_code, r.json()) == (401, REFUSAL), (method, path)
    assert app.sent == [], "a refused request must not reach a rank"


@pytest.mark.parametrize("key", KEYS)
def test_any_configured_key_is_accepted(app, key) -> None:
    headers = {"authorization": f"Bearer {key}"}
    for method, path in protected_routes():
        r = call(app, method, path, headers)
        assert r.status_code != 401, (method, path, r.text)
    r = app.client.post(
        "/v1/completions", content=json.dumps({"prompt": "ab", "max_tokens": 1}), headers=headers
    )
    assert r.status_code == 200


def test_public_routes_need_no_key(app) -> None:
    assert app.client.get("/version").status_code == 200
    assert app.client.get("/load").json() == {"server_load": 0}


def test_every_key_is_compared_in_constant_time(app, monkeypatch) -> None:
    import secrets

    from roundgate.deployment import ingress

    compared: list[bytes] = []
    real = secrets.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(ingress.secrets, "compare_digest", spy)
    r = app.client.get("/v1/models", headers={"authorization": f"Bearer {KEYS[0]}"})
    assert r.status_code == 200
    # no early exit at the first match: every key is compared, whichever matched
    assert compared == [f"Bearer {k}".encode() for k in KEYS]


@pytest.mark.parametrize(
    ("api_key", "env", "keys"),
    [
        (None, None, ()),
        ("one", None, ("one",)),
        (["one", "two"], None, ("one", "two")),
        (["one", ""], None, ("one",)),
        (None, "from-env", ("from-env",)),
        ("given", "from-env", ("given",)),
    ],
)
def test_keys_resolve_from_the_config_or_the_environment(monkeypatch, api_key, env, keys) -> None:
    if env is None:
        monkeypatch.delenv("ROUNDGATE_API_KEY", raising=False)
    else:
        monkeypatch.setenv("ROUNDGATE_API_KEY", env)
    args = AppArgs.model_validate({**APP_ARGS, "api_key": api_key})
    assert args.resolved_api_keys == keys


def test_the_ingress_takes_its_keys_from_the_config(monkeypatch) -> None:
    monkeypatch.delenv("ROUNDGATE_API_KEY", raising=False)
    core = Ingress({**APP_ARGS, "api_key": KEYS}, {FUSED: FakeRanks(echo_reply)})
    assert core.api_keys == tuple(KEYS)
