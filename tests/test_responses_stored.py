"""The Responses API beyond one request: stored responses (``GET``, ``DELETE``), background
responses and their cancellation, ``include`` logprobs, and vLLM's extra sampling fields,
through the real HTTP app and the real ``openai`` client on a fake rank (no Ray)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

import openai
import pytest
from ingress_fakes import tokens
from test_responses_api import Served, says

from roundgate.actors.control.messages import GenerateChunk, GenerateRequest
from roundgate.actors.control.request import TokenLogprobs
from roundgate.deployment.openai.response_store import ResponseStore, StoredResponse

ANSWER = "Hello there."


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    s = Served(monkeypatch, says(ANSWER))
    with s.http:
        yield s


def with_logprobs(text: str) -> Callable[[GenerateRequest], list[Any]]:
    """A rank answering ``text`` a byte a chunk, each token's logprob -0.5 - its position and
    the top ``k`` alternatives (ids 200, 201, ...) asked for."""

    def reply(message: GenerateRequest) -> list[Any]:
        k = message.sampling.logprobs or 0
        chunks = []
        for i, byte in enumerate(text.encode()):
            lp = TokenLogprobs(
                logprob=-0.5 - i,
                top_ids=tuple(range(200, 200 + k)),
                top_logprobs=tuple(-1.0 - j for j in range(k)),
            )
            last = i == len(text) - 1
            chunk = tokens(byte, finish="stop" if last else None, done=i)
            chunks.append(replace(chunk, logprobs=(lp,)))
        return chunks

    return reply


class HeldStream:
    """A rank stream that sends nothing until released; records its cancellation."""

    def __init__(self) -> None:
        self.cancelled = False
        self.release = asyncio.Event()

    def __aiter__(self) -> AsyncIterator[GenerateChunk]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[GenerateChunk]:
        await self.release.wait()
        yield tokens(*b"late", finish="stop")

    def cancel(self) -> None:
        self.cancelled = True


def poll(served: Served, response_id: str, until: Callable[[Any], bool]) -> Any:
    """GET the response until ``until`` holds (the background task runs on the app's loop,
    between requests); a bounded number of polls, each yielding to that loop."""
    for _ in range(200):
        r = served.client.responses.retrieve(response_id)
        if until(r):
            return r
        time.sleep(0.005)
    raise AssertionError(f"{response_id} never reached the state: last {r.status}")


# ---- GET and DELETE ----------------------------------------------------------------------


def test_get_returns_the_stored_response_and_store_false_is_not_kept(served: Served) -> None:
    made = served.client.responses.create(input="Hi")
    got = served.client.responses.retrieve(made.id)
    assert got.model_dump() == made.model_dump()
    unstored = served.client.responses.create(input="Hi", store=False)
    with pytest.raises(openai.NotFoundError, match=r"Response with id .* not found\."):
        served.client.responses.retrieve(unstored.id)


def test_retrieving_as_a_stream_is_refused_by_name(served: Served) -> None:
    made = served.client.responses.create(input="Hi")
    r = served.http.get(f"/v1/responses/{made.id}", params={"stream": "true"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


def test_delete_forgets_the_response(served: Served) -> None:
    made = served.client.responses.create(input="Hi")
    served.client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        served.client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        served.client.responses.create(input="And?", previous_response_id=made.id)


# ---- background --------------------------------------------------------------------------


def test_a_background_response_is_queued_then_completed_and_continues(served: Served) -> None:
    queued = served.client.responses.create(input="Hi", background=True)
    assert queued.status == "queued" and queued.background and queued.output == []
    done = poll(served, queued.id, lambda r: r.status != "queued")
    assert done.status == "completed" and done.output_text == ANSWER and done.background
    assert done.usage.output_tokens == len(ANSWER)
    served.client.responses.create(input="And?", previous_response_id=queued.id)
    assert f"<|assistant|>\n{ANSWER}\n<|user|>\nAnd?" in served.prompt


def test_cancel_stops_a_background_response_and_its_rank_request(served: Served) -> None:
    held = HeldStream()
    served.ranks.remote = lambda message: held  # type: ignore[method-assign]
    queued = served.client.responses.create(input="Write a story.", background=True)
    with pytest.raises(openai.BadRequestError, match="is queued"):  # nothing to continue yet
        served.client.responses.create(input="More", previous_response_id=queued.id)
    cancelled = served.client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled" and held.cancelled
    assert served.client.responses.retrieve(queued.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError, match=r"Cannot cancel a synchronous response\."):
        served.client.responses.cancel(queued.id)  # already ended


def test_a_synchronous_response_cannot_be_cancelled(served: Served) -> None:
    made = served.client.responses.create(input="Hi")
    with pytest.raises(openai.BadRequestError, match=r"Cannot cancel a synchronous response\."):
        served.client.responses.cancel(made.id)
    with pytest.raises(openai.NotFoundError):
        served.client.responses.cancel("resp_nope")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"store": False}, "background can only be used when `store` is true"),
        ({"stream": True}, "poll GET /v1/responses/{id}"),
    ],
)
def test_background_without_store_or_with_stream_is_refused(
    served: Served, body: dict[str, Any], words: str
) -> None:
    r = served.http.post("/v1/responses", json={"input": "Hi", "background": True, **body})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "background" and words in error["message"]
    assert served.ranks.payloads == []  # refused before any work


def test_the_store_never_drops_a_response_still_running() -> None:
    store = ResponseStore(max_entries=2)
    store.put("running", StoredResponse(body={"status": "queued"}, background=True))
    for name in ("a", "b", "c"):
        store.put(name, StoredResponse(body={"status": "completed"}))
    assert store.get("running") is not None and store.get("a") is None and len(store) == 2


# ---- include logprobs --------------------------------------------------------------------


def test_include_logprobs_puts_each_token_s_logprob_on_the_text(served: Served) -> None:
    served.reply(with_logprobs("Hey"))
    r = served.client.responses.create(
        input="Hi", include=["message.output_text.logprobs"], top_logprobs=3
    )
    assert served.ranks.payloads[-1].sampling.logprobs == 3
    part = r.output[0].content[0]
    assert [lp.token for lp in part.logprobs] == ["H", "e", "y"]
    assert [lp.logprob for lp in part.logprobs] == [-0.5, -1.5, -2.5]
    assert all(len(lp.top_logprobs) == 3 for lp in part.logprobs)
    assert part.logprobs[0].bytes == list(b"H")


def test_streamed_logprobs_ride_the_deltas_and_sum_to_the_final_part(served: Served) -> None:
    served.reply(with_logprobs("Hey"))
    events = list(
        served.client.responses.create(
            input="Hi", include=["message.output_text.logprobs"], top_logprobs=1, stream=True
        )
    )
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    streamed = [lp.logprob for e in deltas for lp in e.logprobs]
    final = events[-1].response.output[0].content[0].logprobs
    assert streamed == [lp.logprob for lp in final] == [-0.5, -1.5, -2.5]


def test_no_include_asks_the_rank_for_no_logprobs(served: Served) -> None:
    r = served.client.responses.create(input="Hi", top_logprobs=5)
    assert served.ranks.payloads[-1].sampling.logprobs is None
    assert r.output[0].content[0].logprobs == []


def test_an_include_roundgate_cannot_fill_is_refused_by_name(served: Served) -> None:
    r = served.http.post(
        "/v1/responses", json={"input": "Hi", "include": ["reasoning.encrypted_content"]}
    )
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "include"
    assert "'reasoning.encrypted_content'" in error["message"]


# ---- vLLM's extra fields -----------------------------------------------------------------


def test_vllm_s_sampling_extensions_reach_the_rank(served: Served) -> None:
    served.client.responses.create(
        input="Hi",
        extra_body={"top_k": 5, "seed": 7, "repetition_penalty": 1.2, "ignore_eos": True},
    )
    sampling = served.ranks.payloads[-1].sampling
    assert (sampling.top_k, sampling.repetition_penalty) == (5, 1.2)
    assert sampling.seed is not None and sampling.stop_token_ids == ()  # ignore_eos: no EOS


def test_chat_template_kwargs_reach_the_template_and_bad_ones_name_the_field(
    served: Served,
) -> None:
    served.client.responses.create(input="Hi", extra_body={"chat_template_kwargs": {"x": 1}})
    r = served.http.post(
        "/v1/responses",
        json={"input": "Hi", "chat_template_kwargs": {"add_generation_prompt": False}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"


@pytest.mark.parametrize("value", ["null", "yes", "true"])
def test_any_stream_query_but_false_is_the_openai_400(served: Served, value: str) -> None:
    made = served.client.responses.create(input="Hi")
    r = served.http.get(f"/v1/responses/{made.id}", params={"stream": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    ok = served.http.get(f"/v1/responses/{made.id}", params={"stream": "false"})
    assert ok.status_code == 200 and ok.json()["id"] == made.id


def test_the_101st_background_response_is_refused_by_name(served: Served) -> None:
    """Background responses run as this replica's tasks, outside Serve's request count: at
    the default limit of 100 running, the next is a 429 naming the limit, made before any
    rank request; once one is cancelled there is room again."""
    held: list[HeldStream] = []

    def hold(message: GenerateRequest) -> HeldStream:
        served.ranks.payloads.append(message)
        held.append(HeldStream())
        return held[-1]

    served.ranks.remote = hold  # type: ignore[method-assign]
    made = [served.client.responses.create(input=f"Story {i}", background=True) for i in range(100)]
    assert len(held) == 100 and all(r.status == "queued" for r in made)
    with pytest.raises(openai.RateLimitError) as refused:
        served.client.responses.create(input="One more", background=True)
    error = refused.value.body
    assert error["code"] == "too_many_background_responses" and error["param"] == "background"
    assert "max_background_responses 100" in error["message"]
    assert len(held) == 100  # refused before any rank request
    served.client.responses.cancel(made[0].id)
    assert served.client.responses.create(input="Now", background=True).status == "queued"
    for r in made[1:]:
        served.client.responses.cancel(r.id)


def test_a_background_response_past_its_timeout_fails_and_frees_its_rank(
    served: Served,
) -> None:
    held = HeldStream()
    served.ranks.remote = lambda message: held  # type: ignore[method-assign]
    served.core.background.timeout_s = 0.05
    queued = served.client.responses.create(input="Write a long story.", background=True)
    failed = poll(served, queued.id, lambda r: r.status != "queued")
    assert failed.status == "failed" and failed.error.code == "background_timeout"
    assert held.cancelled
