"""instructor against a served roundgate: a pydantic model out of a chat completion, in its
default mode (``TOOLS``: a named tool call) and in ``JSON_SCHEMA`` (``response_format``).

Run by tests/integration/test_served_client_libraries.py inside ``.venv-instructor`` (``make
clients``): ``python run_instructor.py BASE_URL MODEL``. It prints one JSON object per mode:
the validated model, the raw completion's arguments or content it came from, and the requests
sent (one each: the server's grammar makes the first answer valid, so instructor never reasks).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import instructor
import openai
from pydantic import BaseModel, Field


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


def main(base_url: str, model: str) -> dict[str, Any]:
    sent: list[dict[str, Any]] = []
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    out: dict[str, Any] = {}
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        sent.clear()
        patched = instructor.from_openai(client, mode=mode)
        # instructor's own hook: the keyword arguments of every request it sends.
        patched.on("completion:kwargs", lambda *args, **kwargs: sent.append(kwargs))
        city, completion = patched.chat.completions.create_with_completion(
            model=model,
            response_model=City,
            messages=[{"role": "user", "content": "Name a city in France and its country."}],
            temperature=0,
            max_tokens=64,
            max_retries=1,
        )
        message = completion.choices[0].message
        out[mode.name] = {
            "type": type(city).__name__,
            "value": city.model_dump(),
            "raw": message.tool_calls[0].function.arguments if message.tool_calls else None,
            "content": message.content,
            "requests": [{k: r.get(k) for k in ("tool_choice", "response_format")} for r in sent],
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2]), default=str))
