"""The default deployment exactly as ``local.yaml`` has it: SmolLM2-135M-Instruct, dp=2, gate on.

Through the official ``openai`` client: greedy completions equal transformers' greedy on the
same GGUF; chat uses the model's template and answers the capital question, ending at the
end-of-turn token; streamed text equals non-streamed text. Bad token ids are a 400 at the
ingress, and sent straight to a rank they fail only that call: a stream beside them completes
and no replica restarts.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
import torch
from helpers import BackgroundStream

from roundgate.actors.control.messages import GenerateRequest, RankTarget
from roundgate.actors.control.request import SamplingParams

MODEL = "smollm2-135m-instruct"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a robot"]
TOKENS = 24


@pytest.fixture(scope="module")
def real(real_model: Any) -> Any:
    """The shared deployment with local.yaml's own model (conftest's ``real_model``)."""
    return real_model


@pytest.fixture(scope="module")
def client(real: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{real.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from roundgate.actors.model.tokenizer import load_tokenizer

    return load_tokenizer(MODEL)


def test_greedy_completions_equal_transformers(client: openai.OpenAI, tokenizer: Any) -> None:
    from transformers import AutoModelForCausalLM

    from roundgate.actors.model.gguf_file import packaged_path

    path = packaged_path(MODEL)
    reference = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        r = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=TOKENS,
            temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        with torch.inference_mode():
            out = reference.generate(
                torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False, eos_token_id=None
            )
        got = r.choices[0].model_extra["token_ids"]
        assert got == out[0, len(ids) :].tolist(), prompt
        assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == TOKENS


def test_chat_answers_in_the_model_s_template_and_stops_at_end_of_turn(
    client: openai.OpenAI, tokenizer: Any
) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64, temperature=0)
    assert r.usage.prompt_tokens == len(tokenizer.render_chat(messages))
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    system = [{"role": "system", "content": "Be brief."}, *messages]
    r2 = client.chat.completions.create(model=MODEL, messages=system, max_tokens=4)
    assert r2.usage.prompt_tokens == len(tokenizer.render_chat(system))


def test_streamed_text_equals_the_non_streamed_text(client: openai.OpenAI) -> None:
    for prompt in ["Write the word café three times:", "日本の首都は"]:
        kwargs = {"model": MODEL, "prompt": prompt, "max_tokens": 20, "temperature": 0}
        whole = client.completions.create(**kwargs).choices[0].text
        parts = [c.choices[0].text for c in client.completions.create(stream=True, **kwargs)]
        assert "".join(parts) == whole
        # No delta ends inside a character (a tiny model may emit invalid bytes itself:
        # then the non-streamed text has the replacement character too).
        if "\ufffd" not in whole:
            assert all("\ufffd" not in p for p in parts)
    messages = [{"role": "user", "content": "Say hello in French."}]
    kwargs = {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0}
    whole = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(stream=True, **kwargs)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole.choices[0].message.content


@pytest.mark.parametrize("ids", [[49152], [-1, 5], [2**40]], ids=["past-vocab", "neg", "huge"])
def test_bad_token_ids_are_a_400_at_the_ingress(client: openai.OpenAI, ids: list[int]) -> None:
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.completions.create(model=MODEL, prompt=ids, max_tokens=2)


def test_bad_ids_sent_straight_to_a_rank_fail_only_that_call(real: Any) -> None:
    pids = {r: real.rank_call("stats_snapshot", r)["pid"] for r in (0, 1)}
    beside = BackgroundStream(real.url, prompt="Count to twenty:", max_tokens=40, dp_rank=0)
    assert beside.started.wait(120)
    ranks = real.ranks.options(stream=True)
    for ids in ([49152], [-1, 5], [2**40]):
        message = GenerateRequest(
            request_id=f"bad-{ids[0]}",
            prompt_token_ids=tuple(ids),
            sampling=SamplingParams(),
            dp_rank=0,
        )
        chunks = list(ranks.generate.remote(message))
        assert len(chunks) == 1 and chunks[0].finish_reason == "error"
        assert "vocabulary" in chunks[0].error
    assert beside.done.wait(300)
    assert beside.error is None
    finishes = [e["choices"][0]["finish_reason"] for e in beside.events if isinstance(e, dict)]
    assert finishes[-1] == "length"
    after = {
        r: real.ranks.stats_snapshot.remote(RankTarget(r)).result(timeout_s=30) for r in (0, 1)
    }
    assert {r: s["pid"] for r, s in after.items()} == pids, "no replica may restart"
    assert all(s["error"] is None for s in after.values())
