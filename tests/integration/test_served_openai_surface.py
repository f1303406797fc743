"""The OpenAI surface on the default model, through the official ``openai`` client.

Logprobs equal transformers' ``log_softmax`` (top-1 and top-5 within 1e-3); n=4 prefills its
prompt once (the rank's prefill-token counter moves by one prompt) and returns indices 0..3;
every feature streams exactly what it answers without streaming; /tokenize and /detokenize
answer in vLLM's shapes.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import torch
from helpers import default_model_reference, served_client

MODEL = "smollm2-135m-instruct"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(real_model: Any) -> openai.OpenAI:
    return served_client(real_model)


@pytest.fixture(scope="module")
def reference() -> Any:
    return default_model_reference(MODEL)


def joined_completion(client: openai.OpenAI, **kwargs: Any) -> dict[int, dict[str, Any]]:
    """Per choice index: streamed text, finish and logprobs lists joined across chunks."""
    out: dict[int, dict[str, Any]] = {}
    for chunk in client.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            got = out.setdefault(c.index, {"text": "", "finish": None, "lp": None})
            got["text"] += c.text
            got["finish"] = c.finish_reason or got["finish"]
            if c.logprobs is not None:
                lp = got["lp"] = got["lp"] or {k: [] for k in c.logprobs.model_dump()}
                for key, values in c.logprobs.model_dump().items():
                    lp[key] += values
    return out


def test_completion_logprobs_are_transformers_and_stream_the_same(client, reference) -> None:
    kwargs = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 5}
    r = client.completions.create(**kwargs, extra_body={"return_token_ids": True})
    choice = r.choices[0]
    ids = choice.model_extra["prompt_token_ids"] + choice.model_extra["token_ids"]
    with torch.inference_mode():
        logp = torch.log_softmax(reference(torch.tensor([ids])).logits[0], dim=-1)
    start = len(choice.model_extra["prompt_token_ids"]) - 1
    lp = choice.logprobs
    for k, token in enumerate(choice.model_extra["token_ids"]):
        row = logp[start + k]
        assert abs(lp.token_logprobs[k] - row[token].item()) < 1e-3
        top = row.topk(5).values.tolist()
        assert sorted(lp.top_logprobs[k].values(), reverse=True)[:5] == pytest.approx(top, abs=1e-3)
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [len("".join(lp.tokens[:k])) for k in range(len(lp.tokens))]
    streamed = joined_completion(client, **kwargs)[0]
    assert streamed["text"] == choice.text and streamed["lp"] == lp.model_dump()


def test_chat_logprobs_stream_the_same(client) -> None:
    kwargs = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name a color."}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    whole = client.chat.completions.create(**kwargs).choices[0]
    content = whole.logprobs.content
    assert len(content) == 6 and all(len(t.top_logprobs) == 3 for t in content)
    assert content[0].top_logprobs[0].logprob >= content[0].logprob - 1e-6
    streamed = [
        t
        for chunk in client.chat.completions.create(stream=True, **kwargs)
        if chunk.choices and chunk.choices[0].logprobs is not None
        for t in chunk.choices[0].logprobs.content
    ]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in content]


def test_n_prefills_the_prompt_once_and_streams_the_same(client, real_model) -> None:
    kwargs = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 11,
        "n": 4,
    }
    before = [real_model.rank_call("stats_snapshot", r)["prefill_tokens"] for r in (0, 1)]
    r = client.completions.create(**kwargs, extra_body={"dp_rank": 0, "return_token_ids": True})
    after = [real_model.rank_call("stats_snapshot", r)["prefill_tokens"] for r in (0, 1)]
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    prompt = len(r.choices[0].model_extra["prompt_token_ids"])
    assert after[0] - before[0] == r.usage.prompt_tokens == prompt  # one prefill, counted once
    assert after[1] == before[1]
    assert r.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in r.choices)
    assert len({c.text for c in r.choices}) > 1, "each sequence has its own stream"
    streamed = joined_completion(client, **kwargs, extra_body={"dp_rank": 1})
    assert {i: s["text"] for i, s in streamed.items()} == {c.index: c.text for c in r.choices}


@pytest.mark.parametrize(
    "extra",
    [
        {"presence_penalty": 1.0, "frequency_penalty": 0.5, "temperature": 0.8, "seed": 2},
        {"repetition_penalty": 1.3, "min_p": 0.1, "temperature": 1.0, "seed": 4},
        {"logit_bias": {"7042": -100}, "min_tokens": 4, "echo": True, "temperature": 0, "n": 2},
        {"stop": ["is."], "temperature": 0},  # the stop that once made a stream repeat text
    ],
    ids=["openai-penalties", "vendor-sampling", "bias-min-echo", "stop-string"],
)
def test_sampling_fields_stream_what_they_answer(client, extra) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12}
    vendor = {k: extra.pop(k) for k in ("repetition_penalty", "min_p", "min_tokens") if k in extra}
    choices = client.completions.create(**body, **extra, extra_body=vendor).choices
    streamed = joined_completion(client, **body, **extra, extra_body=vendor)
    assert len(choices) == len(streamed) == extra.get("n", 1)
    for whole in choices:
        got = streamed[whole.index]
        assert (got["text"], got["finish"]) == (whole.text, whole.finish_reason)
        if extra.get("echo"):
            assert whole.text.startswith(PROMPT)


def test_tokenize_and_detokenize_in_vllm_shapes(client, real_model) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    with httpx.Client(base_url=real_model.url, timeout=60) as http:
        chat = http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()
        assert chat["count"] == len(chat["tokens"]) == r.usage.prompt_tokens
        assert chat["max_model_len"] == 8192
        text = http.post("/tokenize", json={"prompt": PROMPT, "return_token_strs": True}).json()
        # vLLM's token_strs: vocabulary pieces (byte-level BPE spells a space "Ġ")
        assert "".join(text["token_strs"]).replace("\u0120", " ") == PROMPT
        back = http.post("/detokenize", json={"tokens": text["tokens"]}).json()
        assert back == {"prompt": PROMPT}
        bad = http.post("/detokenize", json={"tokens": [10**9]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
