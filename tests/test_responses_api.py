"""``POST /v1/responses`` through the real HTTP app and the real ``openai`` client, on a fake
rank (no Ray): text and message-list input, instructions, max_output_tokens, the streamed
event sequence, function tools, previous_response_id, and errors in the OpenAI envelope.

The app is ``roundgate.deployment.openai.api``'s FastAPI instance with the routes
``roundgate.deployment.app`` registers; Serve's per-replica ``self``
(``serve.get_replica_context().servable_object``) is a stand-in holding a fake-rank ``Ingress``. The
tiny-moe tokenizer is bytes, so the rank's ids spell the answer and the prompt reads back as the
rendered transcript.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from ingress_fakes import echo_reply, make_ingress, tokens

from roundgate.actors.control.messages import GenerateRequest
from roundgate.deployment.openai.response_store import ResponseStore, StoredResponse
from roundgate.deployment.openai.responses_stream import OutputItems

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
EVENTS_OF_A_MESSAGE = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def says(text: str) -> Callable[[GenerateRequest], list[Any]]:
    """A rank that answers ``text`` (bytes as ids), three bytes a chunk, then stops."""

    def reply(message: GenerateRequest) -> list[Any]:
        ids = list(text.encode())
        prompt = len(message.prompt_token_ids)
        pieces = [ids[i : i + 3] for i in range(0, len(ids), 3)] or [[]]
        return [
            tokens(*p, finish="stop" if k == len(pieces) - 1 else None, prompt=prompt, done=3 * k)
            for k, p in enumerate(pieces)
        ]

    return reply


class Served:
    """The app on a fake rank, and an ``openai`` client that talks to it in-process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, reply: Callable) -> None:
        from ray import serve

        import roundgate.deployment.app  # noqa: F401  (registers the routes on ``api``)
        from roundgate.deployment.openai.api import api

        self.core, self.ranks = make_ingress(reply)
        # The routes use nothing of the replica's object but its ``core``.
        context = SimpleNamespace(servable_object=SimpleNamespace(core=self.core))
        monkeypatch.setattr(serve, "get_replica_context", lambda: context)

        self.http = TestClient(api, base_url="http://roundgate")
        self.client = openai.OpenAI(
            base_url="http://roundgate/v1", api_key="unused", http_client=self.http, max_retries=0
        )

    def reply(self, reply: Callable) -> None:
        self.ranks.reply = reply

    @property
    def prompt(self) -> str:
        """The last rank request's prompt, as text (tiny-moe's ids are bytes)."""
        return bytes(t for t in self.ranks.payloads[-1].prompt_token_ids if t < 256).decode()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    s = Served(monkeypatch, says("Hello there."))
    with s.http:
        yield s


# ---- text in, text out -------------------------------------------------------------------


def test_text_input_answers_one_completed_message(served: Served) -> None:
    r = served.client.responses.create(model="tiny-moe", input="Hi", instructions="Be brief.")
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text == "Hello there."
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert item.content[0].type == "output_text"
    assert r.instructions == "Be brief." and r.model == "tiny-moe"
    assert r.usage.output_tokens == len("Hello there.")
    assert r.usage.input_tokens == len(served.ranks.payloads[-1].prompt_token_ids)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert served.prompt == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"


def test_a_message_list_renders_every_turn_in_order(served: Served) -> None:
    served.client.responses.create(
        input=[
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "message", "role": "assistant", "content": "Bonjour."},
            {"role": "user", "content": "And?"},
        ],
    )
    assert served.prompt == (
        "<|developer|>\nAnswer in French.\n<|user|>\nHi\n<|assistant|>\nBonjour.\n"
        "<|user|>\nAnd?\n<|assistant|>\n"
    )


def test_sampling_fields_reach_the_rank(served: Served) -> None:
    served.client.responses.create(input="Hi", temperature=0.0, top_p=0.5, max_output_tokens=7)
    sampling = served.ranks.payloads[-1].sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens) == (0.0, 0.5, 7)


def test_max_output_tokens_ends_an_incomplete_response(served: Served) -> None:
    served.reply(echo_reply)  # answers until max_tokens, finished by length
    r = served.client.responses.create(input="Hi", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


# ---- streaming ---------------------------------------------------------------------------


def test_streaming_sends_the_event_sequence_and_the_same_text(served: Served) -> None:
    events = list(served.client.responses.create(input="Hi", stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas == 4  # "Hello there." in chunks of three bytes
    assert [k for i, k in enumerate(kinds) if k != kinds[i - 1] or i == 0] == EVENTS_OF_A_MESSAGE
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert text == done.output_text == "Hello there."
    assert events[0].response.status == "in_progress" and done.status == "completed"
    assert {e.item_id for e in events if hasattr(e, "item_id")} == {done.output[0].id}


def test_streaming_is_sse_with_named_events(served: Served) -> None:
    with served.http.stream("POST", "/v1/responses", json={"input": "Hi", "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        body = r.read().decode()
    frames = [f for f in body.split("\n\n") if f]
    first = frames[0].split("\n")
    assert first[0] == "event: response.created"
    assert json.loads(first[1][len("data: ") :])["type"] == "response.created"


def test_a_failure_mid_stream_is_an_error_event_then_response_failed(served: Served) -> None:
    served.reply(lambda m: [tokens(72, prompt=1), RuntimeError("rank died")])
    kinds = [e.type for e in served.client.responses.create(input="Hi", stream=True)]
    assert kinds[-2:] == ["error", "response.failed"]


# ---- function tools ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_is_a_function_call_item(served: Served, stream: bool) -> None:
    served.reply(says(CALL))
    kwargs = {"input": "Weather in Paris?", "tools": [WEATHER]}
    if stream:
        events = list(served.client.responses.create(stream=True, **kwargs))
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.done" in kinds
        assert "response.output_text.delta" not in kinds
        r = events[-1].response
    else:
        r = served.client.responses.create(**kwargs)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert '"name": "get_weather"' in served.prompt  # rendered for the model


def test_a_tool_result_continues_the_conversation(served: Served) -> None:
    served.reply(says(CALL))
    first = served.client.responses.create(input="Weather in Paris?", tools=[WEATHER])
    call = first.output[0]
    served.reply(says("Sunny."))
    r = served.client.responses.create(
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24C"},
        ],
        tools=[WEATHER],
    )
    assert r.output_text == "Sunny."
    assert '"city": "Paris"' in served.prompt and "<|tool|>\nsunny, 24C" in served.prompt


def test_tool_choice_none_parses_no_calls(served: Served) -> None:
    served.reply(says(CALL))
    r = served.client.responses.create(input="Hi", tools=[WEATHER], tool_choice="none")
    assert r.output[0].type == "message" and r.output_text == CALL


# ---- previous_response_id ----------------------------------------------------------------


def test_previous_response_id_continues_the_stored_conversation(served: Served) -> None:
    first = served.client.responses.create(input="My name is Ada.", instructions="Be brief.")
    served.client.responses.create(input="What is my name?", previous_response_id=first.id)
    # The earlier turns, the answer included; the earlier instructions are not carried over.
    assert served.prompt == (
        "<|user|>\nMy name is Ada.\n<|assistant|>\nHello there.\n"
        "<|user|>\nWhat is my name?\n<|assistant|>\n"
    )


def test_a_streamed_response_is_stored_too(served: Served) -> None:
    events = list(served.client.responses.create(input="One", stream=True))
    served.client.responses.create(input="Two", previous_response_id=events[-1].response.id)
    assert "<|user|>\nOne\n<|assistant|>\nHello there.\n<|user|>\nTwo" in served.prompt


@pytest.mark.parametrize("store", [True, False])
def test_an_unknown_or_unstored_id_is_a_404_naming_it(served: Served, store: bool) -> None:
    missing = "resp_nope"
    if not store:
        missing = served.client.responses.create(input="Hi", store=False).id
    with pytest.raises(openai.NotFoundError) as info:
        served.client.responses.create(input="Hi", previous_response_id=missing)
    error = info.value.body
    assert error["param"] == "previous_response_id" and error["code"] == "response_not_found"
    assert repr(missing) in error["message"]


def test_the_store_drops_the_least_recently_used_past_its_bound() -> None:
    store = ResponseStore(max_entries=2)
    for name in ("a", "b"):
        store.put(name, StoredResponse(messages=()))
    assert store.get("a") is not None  # now the most recently used
    store.put("c", StoredResponse(messages=()))
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2


# ---- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({}, "input", "input"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens", ""),
        ({"input": "Hi", "temperature": 3}, "temperature", ""),
        ({"input": "Hi", "max_output_tokens": 2.5}, "max_output_tokens", ""),
        ({"input": "Hi", "frequency": 1}, "frequency", "unknown field"),
        ({"input": "Hi", "reasoning": {"effort": "high"}}, "reasoning", "not supported"),
        ({"input": "Hi", "truncation": "auto"}, "truncation", "not supported"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input", "input.0"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "'reasoning'"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input", "call_id"),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools", "'web_search'"),
        ({"input": "Hi", "tool_choice": {"type": "file_search"}}, "tool_choice", "tool_choice"),
        ({"input": "Hi", "text": {"format": {"type": "yaml"}}}, "text", "text.format.type"),
        ({"input": "Hi", "max_output_tokens": 10**6}, "max_output_tokens", "context length"),
        ({"input": "Hi", "model": "gpt-5"}, "model", "does not exist"),
    ],
)
def test_bad_requests_are_a_4xx_naming_the_field(
    served: Served, body: dict[str, Any], param: str, words: str
) -> None:
    r = served.http.post("/v1/responses", json=body)
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"], error


def test_the_sdk_raises_the_error_it_reads(served: Served) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        served.client.responses.create(input="Hi", temperature=3)
    assert info.value.body["param"] == "temperature"


def test_text_format_json_schema_becomes_the_chat_path_s_grammar(served: Served) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    text = {"format": {"type": "json_schema", "name": "A", "schema": schema}}
    served.client.responses.create(input="Hi", text=text)
    kind, spec = served.ranks.payloads[-1].sampling.grammar
    assert kind == "json_schema" and json.loads(spec) == schema


# ---- output items, without HTTP ----------------------------------------------------------


def test_blank_text_between_calls_is_no_item_and_text_after_a_call_joins_the_message() -> None:
    out = OutputItems(parses_tools=True)
    out.feed(CALL + "\n", final=False)
    out.feed("\n" + CALL, final=False)
    out.feed(" done", final=True)
    assert [i["type"] for i in out.items] == ["function_call", "function_call", "message"]
    assert out.text == " done"
    assert [c["name"] for c in out.calls] == ["get_weather", "get_weather"]


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    out = OutputItems(parses_tools=True, max_calls=1)
    out.feed(CALL + CALL, final=True)
    assert len(out.calls) == 1


def test_an_empty_answer_is_one_empty_message() -> None:
    out = OutputItems(parses_tools=False)
    kinds = [e["type"] for e in out.feed("", final=True)]
    assert kinds == EVENTS_OF_A_MESSAGE[2:4] + EVENTS_OF_A_MESSAGE[5:8]
    assert out.items[0]["content"][0]["text"] == ""


@pytest.mark.parametrize("answer", ["Hello there.", "Let me look. " + CALL])
def test_the_sdk_s_stream_helper_accumulates_the_events(served: Served, answer: str) -> None:
    served.reply(says(answer))
    with served.client.responses.stream(model="tiny-moe", input="Hi", tools=[WEATHER]) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(texts) == answer.removesuffix(CALL)
    assert [i.type for i in final.output][1:] == (["function_call"] if CALL in answer else [])


def test_the_sdk_s_parse_gets_a_pydantic_object(served: Served) -> None:
    from pydantic import BaseModel

    class Answer(BaseModel):
        a: int

    served.reply(says('{"a": 1}'))
    r = served.client.responses.parse(model="tiny-moe", input="Hi", text_format=Answer)
    assert r.output_parsed == Answer(a=1)
    assert served.ranks.payloads[-1].sampling.grammar[0] == "json_schema"
