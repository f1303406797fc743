"""``POST /v1/responses`` on the default model through the official ``openai`` client: the same
greedy text as the chat path it is built on, streamed and not; a follow-up by
``previous_response_id`` (and a 404 for an unknown one); an enforced function call. Kept to a
few tokens a request.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from helpers import served_client

MODEL = "smollm2-135m-instruct"
ASK = {
    "model": MODEL,
    "instructions": "Answer in one word.",
    "input": "What colour is the sky?",
    "max_output_tokens": 4,
    "temperature": 0.0,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def client(real_model: Any) -> openai.OpenAI:
    return served_client(real_model)


@pytest.fixture(scope="module")
def answer(client: openai.OpenAI) -> Any:
    return client.responses.create(**ASK)


def test_the_answer_is_the_chat_path_s_greedy_text(client: openai.OpenAI, answer: Any) -> None:
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": ASK["instructions"]},
            {"role": "user", "content": ASK["input"]},
        ],
        max_completion_tokens=4,
        temperature=0.0,
    )
    assert answer.status in ("completed", "incomplete") and answer.output_text
    assert answer.output_text == chat.choices[0].message.content
    assert answer.usage.input_tokens == chat.usage.prompt_tokens
    assert answer.usage.output_tokens == chat.usage.completion_tokens <= 4


def test_streamed_events_carry_the_same_text(client: openai.OpenAI, answer: Any) -> None:
    events = list(client.responses.create(stream=True, **ASK))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == f"response.{answer.status}"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == answer.output_text


def test_a_follow_up_by_previous_response_id(client: openai.OpenAI, answer: Any) -> None:
    r = client.responses.create(
        model=MODEL, input="And the grass?", previous_response_id=answer.id, max_output_tokens=2
    )
    assert r.previous_response_id == answer.id and r.usage.input_tokens > answer.usage.input_tokens
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_unknown")
    assert info.value.body["param"] == "previous_response_id"


def test_a_required_tool_call_is_a_function_call_item(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=48,
        temperature=0.0,
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r.output
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
