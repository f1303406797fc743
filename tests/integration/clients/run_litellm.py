"""litellm's OpenAI-compatible provider (``openai/<model>`` with ``api_base``) against a served
roundgate, as its users call it.

Run by tests/integration/test_served_client_libraries.py inside ``.venv-litellm`` (``make
clients``): ``python run_litellm.py BASE_URL MODEL``. It prints one JSON object: the text of a
completion, the content of each streamed chunk, the message litellm rebuilds from the chunks,
and a tool call parsed into litellm's objects (a named ``tool_choice``, so the server's grammar
makes the call valid). The test compares them with what the server answers the same request.
``LITELLM_LOCAL_MODEL_COST_MAP`` (set by the test) keeps litellm from fetching its price list.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import litellm

PROMPT = "Name three colors."
WEATHER = {
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


def main(base_url: str, model: str) -> dict[str, Any]:
    common = {
        "model": f"openai/{model}",
        "api_base": base_url,
        "api_key": "unused",
        "temperature": 0,
        "num_retries": 0,
    }
    messages = [{"role": "user", "content": PROMPT}]
    out: dict[str, Any] = {}

    r = litellm.completion(messages=messages, max_tokens=12, **common)
    out["completion"] = {
        "type": type(r).__name__,
        "content": r.choices[0].message.content,
        "finish_reason": r.choices[0].finish_reason,
        "completion_tokens": r.usage.completion_tokens,
    }
    chunks = list(litellm.completion(messages=messages, max_tokens=12, stream=True, **common))
    rebuilt = litellm.stream_chunk_builder(chunks, messages=messages)
    out["stream"] = {
        "chunks": [c.choices[0].delta.content for c in chunks if c.choices],
        "finish_reasons": [c.choices[0].finish_reason for c in chunks if c.choices],
        "rebuilt": rebuilt.choices[0].message.content,
    }

    r = litellm.completion(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        **common,
    )
    calls = r.choices[0].message.tool_calls or []
    out["tool_call"] = {
        "types": [type(c).__name__ for c in calls],
        "calls": [(c.id, c.function.name, c.function.arguments) for c in calls],
        "finish_reason": r.choices[0].finish_reason,
    }
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2]), default=str))
