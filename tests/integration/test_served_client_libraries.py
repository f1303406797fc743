"""The client libraries users point at an OpenAI-compatible server, run as they run them, on
the default model: langchain-openai's ``ChatOpenAI`` (``invoke``, ``stream``, ``bind_tools``,
``with_structured_output``), litellm's ``openai/`` provider (completion, streaming, a tool
call), instructor (a pydantic model out of a chat completion) and the ``openai`` SDK's
``chat.completions.parse``.

Each third-party library lives in its own venv (``make clients``; their pins are not ours)
and runs one script from ``clients/`` in one process; the script prints what the library
handed back beside the raw bodies the server sent, and the tests assert the library parsed
exactly that. The ``openai`` SDK is the project's own test dependency, so it runs in-process.
Tool calls and structured outputs go through the server's grammars (a named ``tool_choice``,
``response_format``), so a 135M model's answers are valid by construction; everything is
greedy, so a stream must join to the same text as the call that did not stream.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest
from helpers import served_client
from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parents[2]
CLIENTS = Path(__file__).parent / "clients"
MODEL = "smollm2-135m-instruct"
PROMPT = "Name three colors."  # the scripts' plain-text prompt (greedy, 12 tokens)


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


class GetWeather(BaseModel):
    """Current weather in a city."""

    city: str = Field(max_length=20)


def venv_python(lib: str) -> Path:
    return REPO / f".venv-{lib}" / "bin" / "python"


def needs_venv(lib: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not venv_python(lib).exists(), reason=f".venv-{lib} is missing: run `make clients`"
    )


def run_client(lib: str, deployment: Any) -> dict[str, Any]:
    """``clients/run_<lib>.py`` in the library's venv against the deployment: its JSON."""
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of litellm's price list
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [str(venv_python(lib)), str(CLIENTS / f"run_{lib}.py"), f"{deployment.url}/v1", MODEL]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_streamed(chunks: list[str | None], whole: str) -> None:
    """Several chunks with text, joining to the non-streamed answer."""
    texts = [c for c in chunks if c]
    assert len(texts) >= 2, chunks
    assert "".join(texts) == whole


@pytest.fixture(scope="module")
def client(real_model: Any) -> openai.OpenAI:
    return served_client(real_model)


@pytest.fixture(scope="module")
def plain(client: openai.OpenAI) -> dict[str, Any]:
    """What the server answers the scripts' text prompt, asked directly."""
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=12,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.message.content
    return {
        "content": choice.message.content,
        "finish_reason": choice.finish_reason,
        "completion_tokens": r.usage.completion_tokens,
    }


@needs_venv("langchain")
def test_langchain_chat_openai(real_model, plain) -> None:
    out = run_client("langchain", real_model)
    invoke = out["invoke"]
    assert invoke["type"] == "AIMessage"
    assert invoke["content"] == invoke["raw"] == plain["content"]
    assert invoke["finish_reason"] == plain["finish_reason"]
    raw_usage = invoke["raw_usage"]
    assert invoke["usage"]["input_tokens"] == raw_usage["prompt_tokens"]
    assert invoke["usage"]["output_tokens"] == raw_usage["completion_tokens"]
    assert raw_usage["completion_tokens"] == plain["completion_tokens"]
    assert out["stream"]["request"]["stream"] is True
    assert_streamed(out["stream"]["chunks"], plain["content"])

    tools = out["bind_tools"]
    assert tools["tool_choice"] == {"type": "function", "function": {"name": "GetWeather"}}
    assert tools["finish_reason"] == "tool_calls" and not tools["invalid_tool_calls"]
    (raw,) = tools["raw"]
    (call,) = tools["tool_calls"]
    assert call["name"] == raw["function"]["name"] == "GetWeather"
    assert call["id"] == raw["id"]
    assert call["args"] == json.loads(raw["function"]["arguments"])
    GetWeather.model_validate(call["args"])
    (streamed,) = out["stream_tools"]["tool_calls"]
    assert (streamed["name"], streamed["args"]) == (call["name"], call["args"])

    by_schema = out["structured_json_schema"]
    assert by_schema["response_format"]["type"] == "json_schema"
    assert by_schema["type"] == "City"
    assert by_schema["value"] == City.model_validate_json(by_schema["raw"]).model_dump()
    # The grammar keeps the schema's property order (a sorted order once swapped the answers).
    assert list(json.loads(by_schema["raw"])) == list(City.model_fields)
    by_tool = out["structured_function_calling"]
    assert by_tool["tool_choice"]["function"]["name"] == "City"
    assert by_tool["type"] == "City"
    (raw,) = by_tool["raw"]
    assert by_tool["value"] == json.loads(raw["function"]["arguments"])


@needs_venv("litellm")
def test_litellm_openai_provider(real_model, client, plain) -> None:
    out = run_client("litellm", real_model)
    completion = out["completion"]
    assert completion["type"] == "ModelResponse"
    assert completion["content"] == plain["content"]
    assert completion["finish_reason"] == plain["finish_reason"]
    assert completion["completion_tokens"] == plain["completion_tokens"]
    assert_streamed(out["stream"]["chunks"], plain["content"])
    assert out["stream"]["rebuilt"] == plain["content"]
    assert out["stream"]["finish_reasons"][-1] == plain["finish_reason"]

    tool = out["tool_call"]
    assert tool["finish_reason"] == "tool_calls"
    assert tool["types"] == ["ChatCompletionMessageToolCall"]
    ((_, name, arguments),) = tool["calls"]
    served = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather in a city",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 20}},
                        "required": ["city"],
                    },
                },
            }
        ],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        temperature=0,
    )
    (direct,) = served.choices[0].message.tool_calls
    assert (name, json.loads(arguments)) == ("get_weather", json.loads(direct.function.arguments))


@needs_venv("instructor")
def test_instructor_fills_a_pydantic_model(real_model) -> None:
    out = run_client("instructor", real_model)
    tools = out["TOOLS"]
    assert tools["type"] == "City"
    assert tools["requests"] == [
        {"tool_choice": {"type": "function", "function": {"name": "City"}}, "response_format": None}
    ]
    assert tools["value"] == City.model_validate_json(tools["raw"]).model_dump()
    schema = out["JSON_SCHEMA"]
    assert schema["type"] == "City"
    (request,) = schema["requests"]
    assert request["response_format"]["type"] == "json_schema"
    assert schema["value"] == City.model_validate_json(schema["content"]).model_dump()
    assert list(json.loads(schema["content"])) == list(City.model_fields)


def test_openai_sdk_parse(client) -> None:
    kwargs = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name a city in France and its country."}],
        "response_format": City,
        "max_tokens": 64,
        "temperature": 0,
    }
    message = client.chat.completions.parse(**kwargs).choices[0].message
    assert isinstance(message.parsed, City)
    assert message.parsed == City.model_validate_json(message.content)
    with client.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == message.parsed

    r = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice={"type": "function", "function": {"name": "GetWeather"}},
        max_tokens=64,
        temperature=0,
    )
    (call,) = r.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, GetWeather)
    assert call.function.parsed_arguments.model_dump() == json.loads(call.function.arguments)
