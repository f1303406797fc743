"""langchain-openai's ``ChatOpenAI`` against a served roundgate, as its users call it.

Run by tests/integration/test_served_client_libraries.py inside ``.venv-langchain`` (``make
clients``): ``python run_langchain.py BASE_URL MODEL``. It prints one JSON object: what the
library handed back (message text, parsed tool calls, pydantic instances) beside the raw bodies
the server sent and the requests the library made, so the test can assert the library parsed
exactly what the server produced. The tools and schemas are bounded (``max_length``) and the
calls go through the server's grammars (a named ``tool_choice``, ``response_format``), so a
135M model's answers are valid by construction and end well within ``max_tokens``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

PROMPT = "Name three colors."


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


class GetWeather(BaseModel):
    """Current weather in a city."""

    city: str = Field(max_length=20)


class Recorder:
    """httpx hooks keeping each request's JSON body and each non-streamed response's body."""

    def __init__(self) -> None:
        self.exchanges: list[dict[str, Any]] = []

    def request(self, request: httpx.Request) -> None:
        body = json.loads(request.content) if request.content else None
        self.exchanges.append({"request": body, "response": None})

    def response(self, response: httpx.Response) -> None:
        if response.headers.get("content-type", "").startswith("application/json"):
            response.read()
            self.exchanges[-1]["response"] = response.json()

    @property
    def last(self) -> dict[str, Any]:
        return self.exchanges[-1]

    def last_message(self) -> dict[str, Any]:
        return self.last["response"]["choices"][0]["message"]


def main(base_url: str, model: str) -> dict[str, Any]:
    rec = Recorder()
    http = httpx.Client(
        timeout=300, event_hooks={"request": [rec.request], "response": [rec.response]}
    )
    common = {"model": model, "base_url": base_url, "api_key": "unused", "max_retries": 0}
    chat = ChatOpenAI(temperature=0, max_tokens=12, http_client=http, **common)
    tooling = ChatOpenAI(temperature=0, max_tokens=64, http_client=http, **common)
    out: dict[str, Any] = {}

    msg = chat.invoke(PROMPT)
    out["invoke"] = {
        "type": type(msg).__name__,
        "content": msg.content,
        "finish_reason": msg.response_metadata.get("finish_reason"),
        "usage": msg.usage_metadata,
        "raw": rec.last_message()["content"],
        "raw_usage": rec.last["response"]["usage"],
    }
    chunks = list(chat.stream(PROMPT))
    out["stream"] = {
        "chunks": [c.content for c in chunks],
        "request": rec.last["request"],
    }

    weather = tooling.bind_tools([GetWeather], tool_choice="GetWeather")
    call = weather.invoke("What is the weather in Paris?")
    out["bind_tools"] = {
        "tool_calls": call.tool_calls,
        "invalid_tool_calls": call.invalid_tool_calls,
        "finish_reason": call.response_metadata.get("finish_reason"),
        "raw": rec.last_message().get("tool_calls"),
        "tool_choice": rec.last["request"].get("tool_choice"),
    }
    summed = None
    for chunk in weather.stream("What is the weather in Paris?"):
        summed = chunk if summed is None else summed + chunk
    out["stream_tools"] = {"tool_calls": summed.tool_calls if summed is not None else None}

    for method in ("json_schema", "function_calling"):
        city = tooling.with_structured_output(City, method=method).invoke(
            "Name a city in France and its country."
        )
        raw = rec.last_message()
        out[f"structured_{method}"] = {
            "type": type(city).__name__,
            "value": city.model_dump(),
            "raw": raw["content"] if method == "json_schema" else raw["tool_calls"],
            "response_format": rec.last["request"].get("response_format"),
            "tool_choice": rec.last["request"].get("tool_choice"),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2]), default=str))
