"""Structured output and tool calls on the default model, through the official ``openai``
client: json_schema answers validate for 20 varied prompts, a tool-call round trip parses,
and both stream exactly what they answer."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from helpers import served_client

MODEL = "smollm2-135m-instruct"
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["answer", "confidence"],
    },
    {
        "type": "object",
        "properties": {
            "colors": {
                "type": "array",
                "items": {"type": "string", "maxLength": 12},
                "minItems": 1,
                "maxItems": 3,
            },
            "favorite": {"type": "boolean"},
        },
        "required": ["colors", "favorite"],
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
        },
        "required": ["city", "country"],
    },
]
TOPICS = ["a pirate", "Paris", "a cat", "the moon", "a teacher"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def client(real_model: Any) -> openai.OpenAI:
    return served_client(real_model)


def ask(client: openai.OpenAI, i: int) -> tuple[dict, Any]:
    schema = SCHEMAS[i % len(SCHEMAS)]
    topic = TOPICS[i % len(TOPICS)]
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Answer in JSON about {topic}."}],
        max_tokens=64,
        temperature=0 if i < 10 else 0.8,
        seed=i,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": f"s{i}", "schema": schema},
        },
    )
    return schema, r.choices[0]


def test_json_schema_answers_validate_for_20_prompts(client) -> None:
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: ask(client, i), range(20)))
    finished = [(s, c) for s, c in results if c.finish_reason != "length"]
    assert len(finished) >= 18, [c.message.content for _, c in results]
    for schema, choice in finished:
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_structured_output_streams_what_it_answers(client) -> None:
    kwargs = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Is water wet?"}],
        "max_tokens": 8,
        "temperature": 0,
        "extra_body": {"guided_choice": ["yes", "no", "it depends"]},
    }
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    assert whole in ["yes", "no", "it depends"]
    parts = client.chat.completions.create(stream=True, **kwargs)
    assert "".join(c.choices[0].delta.content or "" for c in parts if c.choices) == whole


def test_a_tool_call_round_trip_parses_with_the_client(client) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    kwargs = {"model": MODEL, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 40}
    r = client.chat.completions.create(messages=messages, temperature=0, **kwargs)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert isinstance(args["city"], str)
    # Streamed: the same call, as deltas the client accumulates.
    streamed = [
        tc
        for chunk in client.chat.completions.create(
            messages=messages, temperature=0, stream=True, **kwargs
        )
        if chunk.choices and chunk.choices[0].delta.tool_calls
        for tc in chunk.choices[0].delta.tool_calls
    ]
    assert [(t.function.name, t.function.arguments) for t in streamed] == [
        (call.function.name, call.function.arguments)
    ]
    followup = [
        *messages,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees."},
    ]
    final = client.chat.completions.create(
        model=MODEL, messages=followup, tools=[WEATHER], max_tokens=24, temperature=0
    ).choices[0]
    assert final.finish_reason in ("stop", "length") and final.message.content
