"""The real HTTP app (``roundgate.deployment.app``'s routes, FastAPI and the error handlers) on a
fake rank, without Ray: what the vLLM-compatibility and API-key tests drive."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from ingress_fakes import make_ingress
from test_api_contract import scoring_reply

from roundgate.actors.control.messages import GenerateRequest

MESSAGES = [{"role": "user", "content": "hi"}]


class App:
    """The HTTP app serving one fake-rank ingress: ``post``/``get`` answer status and JSON (a
    stream: its events); ``sent`` are the rank requests."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, reply: Callable = scoring_reply) -> None:
        from ray import serve

        import roundgate.deployment.app as app  # the routes, registered on the shared FastAPI app

        self.core, self.ranks = make_ingress(reply)
        server = SimpleNamespace(core=self.core)  # what Serve hands the routes as ``self``
        monkeypatch.setattr(
            serve, "get_replica_context", lambda: SimpleNamespace(servable_object=server)
        )
        self.client = TestClient(app.api)

    @property
    def sent(self) -> list[GenerateRequest]:
        return self.ranks.payloads

    def post(self, path: str, **body: Any) -> tuple[int, Any]:
        r = self.client.post(path, content=json.dumps(body))
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            lines = [x[len("data: ") :] for x in r.text.split("\n\n") if x.startswith("data: ")]
            return r.status_code, [json.loads(x) for x in lines if x != "[DONE]"]
        return r.status_code, r.json()

    def chat(self, **body: Any) -> tuple[int, Any]:
        return self.post("/v1/chat/completions", **{"messages": MESSAGES, **body})

    def complete(self, **body: Any) -> tuple[int, Any]:
        return self.post("/v1/completions", **{"prompt": "ab", **body})


def error(answer: tuple[int, Any]) -> tuple[int, str | None, str]:
    status, body = answer
    return status, body["error"]["param"], body["error"]["message"]


def content(events: list[dict[str, Any]]) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
