"""The ingress turns the OpenAI sampling fields into one SamplingParams, or a 400 naming one;
logprobs and text offsets follow the tokens a stop string keeps."""

from __future__ import annotations

from typing import Any

import pytest
from ingress_fakes import complete, error_of, make_ingress

from roundgate.actors.control.messages import GenerateChunk, GenerateRequest, Usage
from roundgate.actors.control.request import TokenLogprobs


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ({"presence_penalty": 0.5}, {"presence_penalty": 0.5}),
        ({"frequency_penalty": -1.0}, {"frequency_penalty": -1.0}),
        ({"repetition_penalty": 1.3}, {"repetition_penalty": 1.3}),
        ({"min_p": 0.1, "temperature": 1.0}, {"min_p": 0.1}),
        ({"min_tokens": 3, "max_tokens": 5}, {"min_tokens": 3}),
        ({"logit_bias": {"7": 5.0, "9": -100}}, {"logit_bias": ((7, 5.0), (9, -100))}),
        ({"logprobs": 0}, {"logprobs": 0}),
        ({"logprobs": 20}, {"logprobs": 20}),
        ({"seed": 7, "temperature": 1.0}, {"seed": 7}),
    ],
)
def test_sampling_fields_reach_the_rank(body: dict[str, Any], want: dict[str, Any]) -> None:
    core, ranks = make_ingress()
    complete(core, prompt="ab", **{"max_tokens": 4, **body})
    sampling = ranks.payloads[0].sampling
    assert {k: getattr(sampling, k) for k in want} == want


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"logit_bias": {"x": 1.0}}, "logit_bias", "not a token id"),
        ({"logit_bias": {"512": 1.0}}, "logit_bias", "outside the vocabulary"),
        ({"logit_bias": {"1": 101}}, "logit_bias", "less than or equal"),
        ({"stop_token_ids": [600]}, "stop_token_ids", "outside the vocabulary"),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens", "max_tokens"),
        ({"logprobs": 21}, "logprobs", "greater than max allowed: 20"),
        ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal"),
        ({"repetition_penalty": 0}, "repetition_penalty", "greater than"),
        ({"stop": ["x" * 257]}, "stop", "at most 256"),
    ],
)
def test_bad_sampling_fields_are_a_400_naming_them(body, param, fragment) -> None:
    core, ranks = make_ingress()
    exc = error_of(lambda: complete(core, prompt="ab", **{"max_tokens": 4, **body}))
    assert (exc.status, exc.param) == (400, param) and fragment in exc.message
    assert ranks.payloads == []


def lp(token: int) -> TokenLogprobs:
    return TokenLogprobs(-0.5 - token, (token, 1), (-0.5 - token, -3.0))


def spelled(message: GenerateRequest) -> list[Any]:
    """Byte tokens 'a b c d e f' in chunks of two, each with its logprobs."""
    ids = [ord(c) for c in "abcdef"]
    out, done = [], 0
    for i in range(0, 6, 2):
        part = ids[i : i + 2]
        done += 2
        finish = "length" if done == 6 else None
        out.append(
            GenerateChunk(
                token_ids=tuple(part),
                finish_reason=finish,
                usage=Usage(prompt_tokens=2, completion_tokens=done),
                error=None,
                logprobs=tuple(map(lp, part)),
            )
        )
    return out


@pytest.mark.parametrize("stop", [None, "cd"])
def test_logprobs_and_offsets_follow_the_kept_tokens(stop: str | None) -> None:
    core, _ = make_ingress(reply=spelled)
    choices, deltas = complete(core, prompt="ab", max_tokens=6, logprobs=1, stop=stop)
    choice = choices[0]
    kept = "ab" if stop else "abcdef"
    # The stop completes at 'd': tokens up to it are kept (their text cut at the stop).
    ids = [ord(c) for c in ("abcd" if stop else "abcdef")]
    assert choice.text == kept and choice.output_token_ids == ids
    assert choice.logprobs == [lp(t) for t in ids]
    assert choice.text_offsets == list(range(len(ids)))
    assert choice.usage.completion_tokens == len(ids)
    streamed = [x for d in deltas for x in d.logprobs]
    assert streamed == choice.logprobs


def interleaved(message: GenerateRequest) -> list[Any]:
    """Sequence j of n answers with 'j' bytes, interleaved, one token per chunk."""
    n, prompt = message.sampling.n, len(message.prompt_token_ids)
    return [
        GenerateChunk(
            token_ids=(48 + j,),
            finish_reason="length" if k == 2 else None,
            usage=Usage(prompt_tokens=prompt, completion_tokens=k + 1),
            index=j,
        )
        for k in range(3)
        for j in range(n)
    ]


def test_n_choices_share_one_rank_request_and_count_the_prompt_once() -> None:
    from roundgate.deployment.openai.choices import usage

    core, ranks = make_ingress(reply=interleaved)
    choices, _ = complete(core, prompt=["ab", "cde"], max_tokens=3, n=3)
    assert [m.sampling.n for m in ranks.payloads] == [3, 3]  # one rank request per prompt
    assert [c.index for c in choices] == list(range(6))
    assert [c.text for c in choices] == ["000", "111", "222"] * 2
    assert usage(choices) == {"prompt_tokens": 5, "completion_tokens": 18, "total_tokens": 23}
