"""vLLM's endpoints beyond chat and completions, through the real HTTP app on a fake rank
(no Ray): ``/v1/chat/completions/batch``, ``/invocations``, ``/load``, and the media type a
body must declare. docs/api.md lists them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.responses import StreamingResponse
from test_api_contract import scoring_reply
from vllm_http import MESSAGES, App, error

from roundgate.actors.control.messages import GenerateRequest
from roundgate.deployment.ingress import Ingress
from roundgate.deployment.openai.server_load import ServerLoad


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> App:
    return App(monkeypatch)


# ---- /v1/chat/completions/batch ------------------------------------------------------------


def test_batched_chat_answers_one_choice_per_conversation(app) -> None:
    conversations = [MESSAGES, [{"role": "user", "content": "yo"}]]
    status, body = app.post("/v1/chat/completions/batch", messages=conversations, max_tokens=2)
    assert status == 200 and body["object"] == "chat.completion"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in body["choices"]] == ["ok", "ok"]
    sent = [bytes(m.prompt_token_ids) for m in app.sent]
    assert b"hi" in sent[0] and b"yo" in sent[1]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": MESSAGES}, "messages"),  # one conversation, not a list of them
        ({"messages": []}, "messages"),
        ({"messages": [MESSAGES], "stream": True}, "stream"),
        ({"messages": [MESSAGES], "n": 2}, "n"),
        ({"messages": [MESSAGES], "frobnicate": 1}, "frobnicate"),
    ],
)
def test_batched_chat_refuses_what_a_batch_cannot_do(app, fields, param) -> None:
    assert error(app.post("/v1/chat/completions/batch", **fields))[:2] == (400, param)
    assert app.sent == []


# ---- /invocations and /load ----------------------------------------------------------------


def test_invocations_dispatches_by_the_body_s_shape(app) -> None:
    status, body = app.post("/invocations", messages=MESSAGES, max_tokens=1)
    assert status == 200 and body["object"] == "chat.completion"
    status, body = app.post("/invocations", prompt="ab", max_tokens=1)
    assert status == 200 and body["object"] == "text_completion"
    status, events = app.post("/invocations", prompt="ab", max_tokens=2, stream=True)
    assert status == 200 and "".join(e["choices"][0]["text"] for e in events) == "ok"
    status, _, message = error(app.post("/invocations", input="x"))
    assert status == 400 and message.startswith("Cannot find suitable handler for request.")
    status, param, _ = error(app.post("/invocations", prompt="ab", frobnicate=1))
    assert (status, param) == (400, "frobnicate")  # the target route's own checks


def test_load_counts_the_generation_requests_in_flight(monkeypatch) -> None:
    seen: list[dict[str, int]] = []
    holder: dict[str, Ingress] = {}

    def reply(message: GenerateRequest) -> list[Any]:
        seen.append(holder["core"].load.snapshot())  # while the request is being served
        return scoring_reply(message)

    app = App(monkeypatch, reply)
    holder["core"] = app.core
    assert app.client.get("/load").json() == {"server_load": 0}
    for path, body in [
        ("/v1/chat/completions", {"messages": MESSAGES}),
        ("/v1/completions", {"prompt": "ab"}),
        ("/invocations", {"prompt": "ab", "stream": True}),
    ]:
        assert app.post(path, **body, max_tokens=1)[0] == 200
    assert seen == [{"server_load": 1}] * 3
    assert app.client.get("/load").json() == {"server_load": 0}
    app.chat(frobnicate=1)  # refused: counted while checked, then released
    assert app.client.get("/load").json() == {"server_load": 0}


def test_a_stream_counts_until_its_last_event() -> None:
    load = ServerLoad()

    async def events() -> Any:
        yield "a"
        yield "b"

    async def route() -> StreamingResponse:
        return StreamingResponse(events())

    async def run() -> list[int]:
        out = await load.track(route())
        counts = [load.num_requests]
        async for _ in out.body_iterator:
            counts.append(load.num_requests)
        await out.background()  # the backup release is idempotent
        return [*counts, load.num_requests]

    assert asyncio.run(run()) == [1, 1, 1, 0]


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/x-www-form-urlencoded", 415),
        ("text/plain", 415),
        ("application/json; charset=utf-8", 200),
        (None, 200),  # no declared type: read as JSON
    ],
)
def test_a_body_declared_as_another_media_type_is_refused(app, content_type, status) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    body = json.dumps({"prompt": "ab", "max_tokens": 1})
    r = app.client.post("/v1/completions", content=body, headers=headers)
    assert r.status_code == status
    if status == 415:
        assert r.json()["error"]["message"] == (
            "Unsupported Media Type: Only 'application/json' is allowed"
        )
