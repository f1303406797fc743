"""The rank's side of resumption: a continuation (the prompt followed by the tokens already
streamed, ``num_resumed_tokens`` of them) generates exactly the rest of the uninterrupted
request, on the real engine and sampler.

The resumed tokens count as output: toward ``max_tokens``, in the output index that seeded
draws and ``min_tokens`` key on, in presence and frequency penalties, and in the grammar
matcher, which replays them. Each case is chosen so that treating them as prompt instead
would change the tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from roundgate.actors.control.messages import GenerateRequest
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.engine import Engine
from roundgate.actors.server_args import ServerArgs

PROMPT = [11, 42, 7, 99, 5]
TOKENS = 12
STOP = 300  # biased to be the likeliest token, so only the min_tokens mask holds it off


@pytest.fixture(scope="module")
def engine() -> Engine:
    torch.set_num_threads(1)
    return Engine(ServerArgs(model="tiny-moe", device="cpu", num_kv_pages=128, max_num_seqs=4))


def generate(engine: Engine, request: Request) -> list[int]:
    engine.run([request])
    assert request.error is None, request.error
    return list(request.output_token_ids)


def resumed(prompt: list[int], sampling: SamplingParams, done: list[int]) -> Request:
    """The rank's request for a continuation, built as the ingress's message builds it."""
    message = GenerateRequest(
        request_id=f"cont-{len(done)}",
        prompt_token_ids=tuple(prompt + done),
        sampling=sampling,
        num_resumed_tokens=len(done),
    )
    return message.to_request()


CASES: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "seeded": {"temperature": 1.0, "seed": 31},
    "seeded top-p": {"temperature": 0.8, "top_p": 0.9, "seed": 5},
    "penalties": {"temperature": 0.0, "frequency_penalty": 2.0, "presence_penalty": 2.0},
    "min tokens": {
        "temperature": 0.0,
        "min_tokens": 8,
        "stop_token_ids": (STOP,),
        "logit_bias": ((STOP, 100.0),),
    },
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("cut", [1, 5])
def test_a_continuation_generates_the_rest_of_the_uninterrupted_output(
    engine: Engine, case: str, cut: int
) -> None:
    sampling = SamplingParams(max_tokens=TOKENS, **CASES[case])
    whole = generate(engine, Request(f"whole-{case}", list(PROMPT), sampling))
    if case == "min tokens":
        assert whole == [*whole[:8], STOP], "the bias makes the stop token come right after"
    rest = generate(engine, resumed(PROMPT, sampling, whole[:cut]))
    assert rest == whole[cut:]


def test_a_continuation_needs_its_resumed_tokens_inside_the_prompt() -> None:
    with pytest.raises(ValueError, match="num_resumed_tokens 3 must be in"):
        Request("r", [1, 2, 3], num_resumed_tokens=3)


GRAMMAR_MODEL = "smollm2-135m-instruct"


def test_a_grammar_continues_from_the_tokens_already_streamed() -> None:
    """The matcher replays the resumed tokens: a fresh matcher would start the JSON again."""
    from roundgate.actors.model.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    engine = Engine(ServerArgs(model=GRAMMAR_MODEL, device="cpu", num_kv_pages=64))
    tokenizer = load_tokenizer(GRAMMAR_MODEL)
    prompt = tokenizer.encode("A JSON object describing a cat:")
    sampling = SamplingParams(max_tokens=16, temperature=1.0, seed=3, grammar=("json_object", ""))
    whole = generate(engine, Request("whole-json", prompt, sampling))
    assert tokenizer.decode(whole).lstrip().startswith("{")
    rest = generate(engine, resumed(prompt, sampling, whole[:6]))
    assert rest == whole[6:]
