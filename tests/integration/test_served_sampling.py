"""Sampling fields through HTTP on the default model, asserted by what they do to the tokens.

The stream-equals-answer checks of ``test_served_openai_surface.py`` pass on a server that
ignores a field; these cannot: a ``logit_bias`` of -100 on the greedy token makes the
runner-up (read from the same request's logprobs) come out instead; ``min_tokens`` keeps a
chat that ends early at EOS going; each penalty's greedy tokens equal transformers' logits
processor on the same GGUF (and differ from plain greedy, so a dropped penalty fails);
``top_k=1``, a tiny ``top_p`` and ``min_p=1`` at temperature 1 each equal greedy where the
same seed without them does not.

Each vendor field is served once, by behaviour: an EBNF ``grammar`` and ``guided_regex`` make
text their pattern matches whole; ``json_object`` an object that parses;
``truncate_prompt_tokens`` prefills exactly that many prompt tokens (the last ones: the
answer equals that prompt's); ``continue_final_message`` continues the assistant's turn (no
end-of-turn in the prompt); ``continuous_usage_stats`` puts the running count in every chunk;
``include_stop_str_in_output`` keeps exactly the stop string; ``skip_special_tokens: false``
writes a special token's text. ``chat_template_kwargs`` is served too, but SmolLM2's template
reads no variable of its own: served, it can only be shown to leave the prompt as it was and to
refuse a key of ``apply_chat_template``'s own (a dropped kwarg is not seen on this model).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from helpers import default_model_reference
from test_default_model_sampling import FrequencyPresence
from transformers import RepetitionPenaltyLogitsProcessor

MODEL = "smollm2-135m-instruct"
PROMPT = "The capital of France is"
# Its greedy output repeats itself at once, so each penalty changes it within TOKENS.
REPEATING = "List three colors: red, red, red,"
TALE = "Once upon a time"
TOKENS = 10
SEED = 7


@pytest.fixture(scope="module")
def served(real_model: Any) -> Iterator[httpx.Client]:
    """An HTTP client of the shared deployment serving the default model."""
    with httpx.Client(base_url=real_model.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def reference() -> Any:
    return default_model_reference(MODEL)


def post(client: httpx.Client, route: str, **body: Any) -> dict[str, Any]:
    """One unary request; anything but a 200 fails with the server's own words."""
    r = client.post(route, json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def completion_ids(client: httpx.Client, prompt: str | list[int], **fields: Any) -> list[int]:
    """The served output ids of one completion of ``TOKENS`` tokens (EOS ignored)."""
    body = {"max_tokens": TOKENS, "ignore_eos": True, "return_token_ids": True, **fields}
    return post(client, "/v1/completions", prompt=prompt, **body)["choices"][0]["token_ids"]


def greedy_ids(client: httpx.Client, prompt: str | list[int], **fields: Any) -> list[int]:
    return completion_ids(client, prompt, temperature=0, **fields)


def test_a_minus_100_bias_on_the_greedy_token_gives_the_runner_up(served) -> None:
    plain = post(
        served,
        "/v1/completions",
        prompt=PROMPT,
        max_tokens=1,
        temperature=0,
        logprobs=2,
        return_token_ids=True,
        return_tokens_as_token_ids=True,
    )["choices"][0]
    # Logprobs are the model's own distribution: its top two are the greedy token and the one
    # a bias of -100 on it leaves on top.
    top = plain["logprobs"]["top_logprobs"][0]
    first, second = (int(k.split(":")[1]) for k in sorted(top, key=top.__getitem__, reverse=True))
    assert plain["token_ids"] == [first]
    biased = greedy_ids(served, PROMPT, max_tokens=1, logit_bias={str(first): -100})
    assert biased == [second]


def test_min_tokens_holds_against_eos(served) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    body = {"messages": messages, "temperature": 0, "return_token_ids": True}
    plain = post(served, "/v1/chat/completions", max_tokens=4 * TOKENS, **body)
    ended = plain["choices"][0]
    assert ended["finish_reason"] == "stop", "the plain answer must end early at EOS"
    at_least = 2 * plain["usage"]["completion_tokens"]  # past where EOS came
    kept = post(served, "/v1/chat/completions", max_tokens=at_least, min_tokens=at_least, **body)
    assert kept["usage"]["completion_tokens"] == at_least
    assert kept["choices"][0]["finish_reason"] == "length"
    assert ended["token_ids"][-1] not in kept["choices"][0]["token_ids"]


def transformers_picks(
    reference: Any, prompt: list[int], output: list[int], processor: Any
) -> list[int]:
    """transformers' greedy pick at each of ``output``'s positions, ``processor`` applied to the
    logits after the same prefix: equal to ``output`` exactly when transformers' greedy
    ``generate`` with that processor gives ``output`` (one forward, the output teacher-forced)."""
    ids = torch.tensor([prompt + output])
    with torch.inference_mode():
        logits = reference(ids).logits[0, len(prompt) - 1 : -1]
        picks = [processor(ids[:, : len(prompt) + k], row[None]) for k, row in enumerate(logits)]
    return [int(scores.argmax()) for scores in picks]


@pytest.fixture(scope="module")
def repeating_greedy(served: httpx.Client) -> list[int]:
    """``REPEATING``'s plain greedy output, which each penalty must change."""
    return greedy_ids(served, REPEATING)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ({"repetition_penalty": 1.3}, lambda n: RepetitionPenaltyLogitsProcessor(1.3)),
        ({"frequency_penalty": 1.0}, lambda n: FrequencyPresence(n, 1.0, 0.0)),
        ({"presence_penalty": 2.0}, lambda n: FrequencyPresence(n, 0.0, 2.0)),
    ],
    ids=["repetition", "frequency", "presence"],
)
def test_each_penalty_equals_transformers_processor(
    served, reference, repeating_greedy, ours, theirs
) -> None:
    got = post(
        served,
        "/v1/completions",
        prompt=REPEATING,
        max_tokens=TOKENS,
        temperature=0,
        ignore_eos=True,
        return_token_ids=True,
        **ours,
    )["choices"][0]
    prompt, output = got["prompt_token_ids"], got["token_ids"]
    assert output != repeating_greedy, f"{ours} must change the greedy output to be seen at all"
    assert output == transformers_picks(reference, prompt, output, theirs(len(prompt)))


@pytest.fixture(scope="module")
def tale_greedy(served: httpx.Client) -> list[int]:
    """The tale's greedy output, which the plain seeded sample at temperature 1 is not: a
    narrowing field that was ignored gives that sample, not greedy."""
    greedy = greedy_ids(served, TALE)
    assert completion_ids(served, TALE, temperature=1.0, seed=SEED) != greedy
    return greedy


@pytest.mark.parametrize(
    "narrow", [{"top_k": 1}, {"top_p": 0.01}, {"min_p": 1.0}], ids=["top_k", "top_p", "min_p"]
)
def test_a_cut_to_one_token_samples_greedy(served, tale_greedy, narrow) -> None:
    assert completion_ids(served, TALE, temperature=1.0, seed=SEED, **narrow) == tale_greedy


def chat_text(client: httpx.Client, content: str, **fields: Any) -> tuple[str, str]:
    """A greedy one-message chat's answer and finish reason."""
    messages = [{"role": "user", "content": content}]
    body = {"max_tokens": 3 * TOKENS, "temperature": 0, **fields}
    choice = post(client, "/v1/chat/completions", messages=messages, **body)["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


@pytest.mark.parametrize(
    ("field", "pattern"),
    [
        ({"structured_outputs": {"grammar": 'root ::= [1-9] [0-9] " apples"'}}, r"[1-9]\d apples"),
        ({"guided_regex": r"\(\d{3}\) \d{3}-\d{4}"}, r"\(\d{3}\) \d{3}-\d{4}"),
    ],
    ids=["ebnf-grammar", "guided-regex"],
)
def test_a_grammar_makes_the_whole_answer_match(served, field, pattern) -> None:
    text, finish = chat_text(served, "How many apples are in a bag? And your phone?", **field)
    assert re.fullmatch(pattern, text) and finish == "stop", text


def test_json_object_answers_an_object_that_parses(served) -> None:
    # Unconstrained, this prompt's answer is a fenced block and more prose: no JSON.
    ask = 'Give a JSON object with the key "city" set to Paris.'
    text, finish = chat_text(served, ask, response_format={"type": "json_object"})
    assert finish == "stop" and isinstance(json.loads(text), dict), text


def test_truncate_prompt_tokens_keeps_the_last_tokens(served) -> None:
    prompt = "One two three four five six seven eight nine ten"
    full = post(served, "/tokenize", prompt=prompt)["tokens"]
    keep = len(full) // 3
    body = {"max_tokens": TOKENS, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    r = post(served, "/v1/completions", prompt=prompt, truncate_prompt_tokens=keep, **body)
    assert r["usage"]["prompt_tokens"] == keep
    assert r["choices"][0]["prompt_token_ids"] == full[-keep:]
    assert r["choices"][0]["token_ids"] == greedy_ids(served, full[-keep:])


def test_continue_final_message_continues_the_assistant_s_turn(served) -> None:
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is the city of"},
    ]
    fields = {"max_tokens": 4, "temperature": 0, "return_token_ids": True}
    flags = {"add_generation_prompt": False, "continue_final_message": True}
    r = post(served, "/v1/chat/completions", messages=messages, **flags, **fields)
    ids = r["prompt_token_ids"]
    assert ids == post(served, "/tokenize", messages=messages, **flags)["tokens"]
    closed = post(served, "/tokenize", messages=messages, add_generation_prompt=False)["tokens"]
    # The turn is left open: the closed rendering is this prompt and the end-of-turn after it.
    assert closed[: len(ids)] == ids and len(closed) > len(ids)
    assert "Paris" in r["choices"][0]["message"]["content"]


def test_chat_template_kwargs_render_the_same_prompt_and_may_not_set_its_fields(served) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    plain = post(served, "/tokenize", messages=messages)["tokens"]
    # SmolLM2's template reads no variable beyond the messages and the generation prompt, so a
    # variable of its own renders the same prompt; one of apply_chat_template's own is a 400.
    body = {"messages": messages, "max_tokens": 1, "return_token_ids": True}
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    assert post(served, "/v1/chat/completions", **body, **extra)["prompt_token_ids"] == plain
    refused = served.post(
        "/v1/chat/completions", json={**body, "chat_template_kwargs": {"tokenize": False}}
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "chat_template_kwargs"


def sse_events(client: httpx.Client, route: str, **body: Any) -> list[dict[str, Any]]:
    """A stream's JSON events (``[DONE]`` dropped)."""
    with client.stream("POST", route, json={"model": MODEL, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        data = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_continuous_usage_stats_count_in_every_chunk(served) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    events = sse_events(
        served,
        "/v1/completions",
        prompt=PROMPT,
        max_tokens=TOKENS,
        temperature=0,
        ignore_eos=True,
        return_token_ids=True,
        stream_options=options,
    )
    *chunks, last = events
    prompt_tokens = len(chunks[0]["choices"][0]["prompt_token_ids"])
    so_far = 0
    for chunk in chunks:
        so_far += len(chunk["choices"][0]["token_ids"])
        assert chunk["usage"]["prompt_tokens"] == prompt_tokens
        assert chunk["usage"]["completion_tokens"] == so_far
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == so_far == TOKENS


def test_include_stop_str_in_output_keeps_exactly_the_stop(served) -> None:
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
    text = post(served, "/v1/completions", **body)["choices"][0]["text"]
    stop = text.split()[1]  # a word inside the greedy text, so the stop is met
    cut = text.index(stop)
    kept = post(served, "/v1/completions", **body, stop=[stop], include_stop_str_in_output=True)
    dropped = post(served, "/v1/completions", **body, stop=[stop])
    assert kept["choices"][0]["text"] == text[: cut + len(stop)]
    assert dropped["choices"][0]["text"] == text[:cut]


def test_skip_special_tokens_false_writes_special_tokens(served) -> None:
    special, name = 1, "<|im_start|>"  # special, and no stop token
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "return_token_ids": True}
    forced = {**body, "logit_bias": {str(special): 100}}
    kept = post(served, "/v1/completions", **forced, skip_special_tokens=False)["choices"][0]
    skipped = post(served, "/v1/completions", **forced)["choices"][0]
    assert kept["token_ids"] == skipped["token_ids"] == [special] * 3
    assert kept["text"] == name * 3 and skipped["text"] == ""
