"""The official ``openai`` client against the running local deployment.

Completions and chat, streaming and not; ``usage`` is checked against the tokenizer and the
returned token ids (vendor field ``return_token_ids``); greedy output through HTTP equals the
offline engine's for the same prompt.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.model.tokenizer import ByteTokenizer
from roundgate.actors.server_args import ServerArgs

TOKENIZER = ByteTokenizer()
EOS = TOKENIZER.eos_token_id
MAX_TOKENS = 12
PROMPTS = ["Hello", "The quick brown fox", "xyz"]  # greedy "xyz" emits EOS as its 7th token
CHAT = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me"}],
]


@pytest.fixture(scope="module")
def client(app) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{app.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def offline(app) -> Engine:
    args = app.args
    return Engine(
        ServerArgs(
            model=args["model"],
            page_size=args["page_size"],
            max_scheduled_tokens=args["max_scheduled_tokens"],
            device="cpu",
        )
    )


def greedy(engine: Engine, prompt_ids: list[int], stop_at_eos: bool) -> list[int]:
    stops = (EOS,) if stop_at_eos else ()
    params = SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=stops)
    return engine.generate([prompt_ids], params)[0]


def chat_ids(messages: list[dict[str, Any]]) -> list[int]:
    return TOKENIZER.render_chat(messages)  # the presets' transcript template


def check_usage(usage: Any, prompt_ids: list[int], output_ids: list[int]) -> None:
    assert usage.prompt_tokens == len(prompt_ids)
    assert usage.completion_tokens == len(output_ids)
    assert usage.total_tokens == len(prompt_ids) + len(output_ids)


# ---- completions ---------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("ignore_eos", [True, False])
def test_completion_equals_offline_greedy(client, offline, prompt, ignore_eos) -> None:
    ids = TOKENIZER.encode(prompt)
    want = greedy(offline, ids, stop_at_eos=not ignore_eos)
    r = client.completions.create(
        model="tiny-moe",
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": ignore_eos, "return_token_ids": True},
    )
    choice = r.choices[0]
    assert choice.model_extra["prompt_token_ids"] == ids
    assert choice.model_extra["token_ids"] == want
    assert choice.text == TOKENIZER.decode(want)
    stopped = not ignore_eos and EOS in want
    assert choice.finish_reason == ("stop" if stopped else "length")
    check_usage(r.usage, ids, want)
    assert r.object == "text_completion" and r.model == "tiny-moe"


def test_the_eos_case_really_stops_early(offline) -> None:
    want = greedy(offline, TOKENIZER.encode("xyz"), stop_at_eos=True)
    assert want[-1] == EOS and len(want) < MAX_TOKENS


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_streamed_completion_matches_the_unary_one(client, offline, prompt) -> None:
    ids = TOKENIZER.encode(prompt)
    want = greedy(offline, ids, stop_at_eos=False)
    chunks = list(
        client.completions.create(
            model="tiny-moe",
            prompt=prompt,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    *deltas, last = chunks
    assert "".join(c.choices[0].text for c in deltas) == TOKENIZER.decode(want)
    assert [c.choices[0].finish_reason for c in deltas][-1] == "length"
    assert all(c.usage is None for c in deltas)
    assert last.choices == []
    check_usage(last.usage, ids, want)
    assert len({c.id for c in chunks}) == 1


def test_token_id_prompts_and_batched_prompts(client, offline) -> None:
    prompts = [TOKENIZER.encode(p) for p in PROMPTS[:2]]
    want = [greedy(offline, p, stop_at_eos=False) for p in prompts]
    r = client.completions.create(
        model="tiny-moe",
        prompt=prompts,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    got = sorted(r.choices, key=lambda c: c.index)
    assert [c.model_extra["token_ids"] for c in got] == want
    assert r.usage.prompt_tokens == sum(map(len, prompts))
    assert r.usage.completion_tokens == sum(map(len, want))


def test_stop_string_ends_the_text_before_it(client, offline) -> None:
    ids = TOKENIZER.encode("Hello")
    text = TOKENIZER.decode(greedy(offline, ids, stop_at_eos=False))
    stop = next(ch for ch in text if ch.isascii() and ch.isprintable())
    r = client.completions.create(
        model="tiny-moe",
        prompt="Hello",
        max_tokens=MAX_TOKENS,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    choice = r.choices[0]
    assert (choice.text, choice.finish_reason) == (text[: text.index(stop)], "stop")
    assert r.usage.completion_tokens == len(choice.model_extra["token_ids"]) < MAX_TOKENS


def test_seeded_sampling_is_reproducible(client) -> None:
    def sample() -> list[int]:
        r = client.completions.create(
            model="tiny-moe",
            prompt="Once upon a time",
            max_tokens=8,
            temperature=0.9,
            top_p=0.95,
            seed=1234,
            extra_body={"top_k": 50, "ignore_eos": True, "return_token_ids": True},
        )
        return r.choices[0].model_extra["token_ids"]

    first = sample()
    assert len(first) == 8 and sample() == first


# ---- chat ----------------------------------------------------------------------------------


@pytest.mark.parametrize("messages", CHAT)
def test_chat_equals_offline_greedy(client, offline, messages) -> None:
    ids = chat_ids(messages)
    want = greedy(offline, ids, stop_at_eos=False)
    r = client.chat.completions.create(
        model="tiny-moe",
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == TOKENIZER.decode(want)
    assert choice.model_extra["token_ids"] == want
    assert choice.finish_reason == "length"
    check_usage(r.usage, ids, want)
    assert r.object == "chat.completion"


def test_streamed_chat(client, offline) -> None:
    messages = CHAT[1]
    ids = chat_ids(messages)
    want = greedy(offline, ids, stop_at_eos=False)
    chunks = list(
        client.chat.completions.create(
            model="tiny-moe",
            messages=messages,
            max_completion_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    *deltas, last = chunks
    assert deltas[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in deltas) == TOKENIZER.decode(want)
    assert deltas[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    check_usage(last.usage, ids, want)


# ---- models and errors through the client ----------------------------------------------------


def test_models_lists_the_served_model(client) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-moe"]
    assert models[0].model_extra["max_model_len"] == 4096


@pytest.mark.parametrize(
    ("kwargs", "error", "param"),
    [
        ({"model": "gpt-5", "prompt": "x"}, openai.NotFoundError, "model"),
        ({"model": "tiny-moe", "prompt": "x", "n": 65}, openai.BadRequestError, "n"),
        ({"model": "tiny-moe", "prompt": "x", "suffix": "y"}, openai.BadRequestError, "suffix"),
        (
            {"model": "tiny-moe", "prompt": "x", "max_tokens": 5000},
            openai.BadRequestError,
            "max_tokens",
        ),
    ],
)
def test_client_sees_openai_style_errors(client, kwargs, error, param) -> None:
    with pytest.raises(error) as info:
        client.completions.create(**kwargs)
    body = info.value.body
    assert set(body) == {"message", "type", "param", "code"}
    assert param is None or body["param"] == param
