"""The API contract on the default model, through real clients: the official ``openai`` SDK's
``parse()`` with a pydantic model (it always sends ``strict: true``), a tool-call round trip
sent the way SDKs send it (``parallel_tool_calls: false``, their own keys inside messages),
and prompt logprobs over HTTP (``echo`` + ``logprobs`` as lm-evaluation-harness sends them,
and vLLM's ``prompt_logprobs``) equal to transformers' on the same GGUF.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import torch
from helpers import default_model_reference, served_client
from pydantic import BaseModel, Field

MODEL = "smollm2-135m-instruct"
ATOL = 1e-3


class City(BaseModel):
    # Bounded, so the grammar ends the answer well within max_tokens.
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def client(real_model: Any) -> openai.OpenAI:
    return served_client(real_model)


@pytest.fixture(scope="module")
def reference() -> Any:
    return default_model_reference(MODEL)


def log_softmax(reference: Any, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(reference(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_the_sdk_s_parse_fills_a_pydantic_model(client) -> None:
    r = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a city in France."}],
        response_format=City,
        max_tokens=60,
        temperature=0,
    )
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and city.name and city.country


def test_a_tool_round_trip_as_sdks_send_it(client) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather in Paris?", "x-trace": "abc"}
    ]
    kwargs = {"model": MODEL, "tools": [WEATHER], "parallel_tool_calls": False}
    first = client.chat.completions.create(
        messages=messages, tool_choice="required", max_tokens=40, temperature=0, **kwargs
    ).choices[0]
    assert first.finish_reason == "tool_calls"
    (call,) = first.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"]
    messages += [
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees."},
    ]
    final = client.chat.completions.create(
        messages=messages, max_tokens=24, temperature=0, **kwargs
    ).choices[0]
    assert final.message.content
    # tool_choice none: no tools in the prompt, no call parsed.
    plain = client.chat.completions.create(
        messages=messages[:1], tool_choice="none", max_tokens=16, temperature=0, **kwargs
    ).choices[0]
    assert not plain.message.tool_calls and plain.finish_reason != "tool_calls"


def test_echo_logprobs_equal_transformers_for_every_prompt_token(client, reference) -> None:
    prompt = "Question: What is the largest planet? Answer: Jupiter"
    r = client.completions.create(
        model=MODEL,
        prompt=prompt,
        echo=True,
        logprobs=3,
        max_tokens=0,
        extra_body={"return_token_ids": True},
    )
    choice = r.choices[0]
    ids = choice.model_extra["prompt_token_ids"]
    lp = choice.logprobs
    assert choice.text == prompt and r.usage.completion_tokens == 0
    assert len(lp.token_logprobs) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = log_softmax(reference, ids)
    for p in range(1, len(ids)):
        row = want[p - 1]
        assert lp.token_logprobs[p] == pytest.approx(float(row[ids[p]]), abs=ATOL)
        top = sorted(lp.top_logprobs[p].values(), reverse=True)[:3]
        assert top == pytest.approx(row.topk(3).values.tolist(), abs=ATOL)


def test_chat_prompt_logprobs_equal_transformers(real_model, reference) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 1,
        "prompt_logprobs": 2,
        "return_token_ids": True,
    }
    r = httpx.post(f"{real_model.url}/v1/chat/completions", json=body, timeout=300).json()
    ids = r["choices"][0]["prompt_token_ids"]
    entries = r["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    want = log_softmax(reference, ids)
    for p in range(1, len(ids)):
        row, entry = want[p - 1], entries[p]
        own = entry[str(ids[p])]
        assert own["logprob"] == pytest.approx(float(row[ids[p]]), abs=ATOL)
        assert own["rank"] >= 1
        best = row.topk(1)
        assert entry[str(int(best.indices[0]))]["logprob"] == pytest.approx(
            float(best.values[0]), abs=ATOL
        )


def test_version_and_tokenizer_info_endpoints(real_model) -> None:
    version = httpx.get(f"{real_model.url}/version", timeout=30).json()
    assert isinstance(version["version"], str)
    info = httpx.get(f"{real_model.url}/tokenizer_info", timeout=30).json()
    assert "chat_template" in info and info["model_max_length"] == 8192
    assert isinstance(info["tokenizer_class"], str)
    assert info["eos_token"] == "<|im_end|>"
