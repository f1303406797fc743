"""Inputs that used to answer a plain-text 500 get a 400 naming what is wrong, and anything
unexpected is a 500 with the OpenAI error body and an id to find it in the log (issue 50's
"no bare 500", the inputs measured on ``make serve``)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from vllm_http import App

COMPLETIONS = "/v1/completions"


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> App:
    return App(monkeypatch)


def post_raw(app: App, path: str, text: str) -> tuple[int, dict]:
    r = app.client.post(path, content=text.encode(), headers={"content-type": "application/json"})
    return r.status_code, r.json()


def test_an_integer_of_5000_digits_is_a_400_naming_it(app: App) -> None:
    status, body = post_raw(app, COMPLETIONS, '{"prompt": "ab", "max_tokens": ' + "9" * 5000 + "}")
    assert status == 400
    assert "an integer of 5000 digits (at most 4300)" in body["error"]["message"]


def test_a_lone_surrogate_in_the_prompt_is_a_400_naming_the_field(app: App) -> None:
    status, body = post_raw(app, COMPLETIONS, '{"prompt": "a\\ud800b", "max_tokens": 4}')
    assert status == 400
    assert body["error"]["param"] == "prompt"
    assert "lone surrogate" in body["error"]["message"]


def test_a_lone_surrogate_deep_in_a_chat_is_named_by_its_path(app: App) -> None:
    text = '{"messages": [{"role": "user", "content": "hi \\udc00"}], "max_tokens": 4}'
    status, body = post_raw(app, "/v1/chat/completions", text)
    assert status == 400
    assert "messages[0].content holds a lone surrogate" in body["error"]["message"]


def test_a_surrogate_pair_is_one_character_and_served(app: App) -> None:
    status, _ = post_raw(app, COMPLETIONS, '{"prompt": "a\\ud83d\\ude00b", "max_tokens": 4}')
    assert status == 200


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(app: App, constant: str) -> None:
    text = '{"prompt": "ab", "max_tokens": 4, "temperature": ' + constant + "}"
    status, body = post_raw(app, COMPLETIONS, text)
    assert status == 400
    assert f"{constant} is not a JSON number" in body["error"]["message"]


def test_a_5000_deep_structured_outputs_json_string_is_a_400(app: App) -> None:
    schema = "[" * 5000 + "]" * 5000
    text = json.dumps({"prompt": "ab", "max_tokens": 4, "structured_outputs": {"json": schema}})
    status, body = post_raw(app, COMPLETIONS, text)
    assert status == 400
    assert body["error"]["param"] == "structured_outputs"
    assert "structured_outputs.json: invalid JSON: nested too deeply" in body["error"]["message"]


def test_anything_unexpected_is_a_500_with_the_openai_body_and_an_id(
    app: App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app.core, "check_auth", broken)
    client = TestClient(app.client.app, raise_server_exceptions=False)
    with caplog.at_level("ERROR", logger="roundgate.api"):
        r = client.post(COMPLETIONS, json={"prompt": "ab", "max_tokens": 4})
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["code"] == "internal_error" and "RuntimeError" in error["message"]
    incident = error["message"].split()[2]
    assert incident.startswith("err-")
    assert any(incident in rec.getMessage() and rec.exc_info for rec in caplog.records)
