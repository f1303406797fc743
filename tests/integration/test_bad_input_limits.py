"""The API key when one is set, and 50 MB and deeply nested bodies, each gets its error body."""

from __future__ import annotations

import httpx
import pytest
from helpers import (
    COMPLETIONS,
    MIB,
    check_error_body,
    check_still_serving,
    wait_until,
)


def test_api_key_is_required_when_set(redeploy) -> None:
    from roundgate.deployment.local import deploy

    # conftest's readiness probe sends no key, so deploy directly; ``redeploy`` restores the
    # default (keyless) app afterwards because overrides are set.
    redeploy.overrides = {"api_key": "sekrit"}
    deploy(redeploy.cfg, redeploy.overrides)
    url = redeploy.url
    good = {"authorization": "Bearer sekrit"}
    prompt = {"prompt": "a", "max_tokens": 1}

    def ready() -> bool:
        try:
            r = httpx.post(f"{url}{COMPLETIONS}", json=prompt, headers=good, timeout=30)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    wait_until(ready, timeout_s=120, interval_s=0.5)
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "sekrit"}):
        for method, path, payload in (("POST", COMPLETIONS, prompt), ("GET", "/v1/models", None)):
            r = httpx.request(method, f"{url}{path}", json=payload, headers=headers, timeout=60)
            check_error_body(r, 401, "invalid_api_key", None)
    assert httpx.get(f"{url}/v1/models", headers=good, timeout=60).status_code == 200
    assert httpx.get(f"{url}/health", timeout=60).status_code == 200  # probes need no key


def test_a_50_mb_body_gets_the_413_body_not_a_reset(app, http, in_flight) -> None:
    raw = b'{"prompt": "' + b"a" * (50 * MIB) + b'"}'
    r = http.post(COMPLETIONS, content=raw, headers={"content-type": "application/json"})
    check_error_body(r, 413, "body_too_large", None)
    check_still_serving(app)


@pytest.mark.parametrize("depth", [100_000])
def test_deeply_nested_json_is_a_400_with_the_openai_body(app, http, in_flight, depth) -> None:
    raw = b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    r = http.post(COMPLETIONS, content=raw, headers={"content-type": "application/json"})
    check_error_body(r, 400, None, None)
    check_still_serving(app)
