"""Sampling transforms and logprobs on the default model, against transformers on the same GGUF.

Greedy outputs with each penalty, ``logit_bias`` and ``min_tokens`` equal transformers'
``generate`` with the matching logits processor (presence/frequency: OpenAI's formula as a
processor written here); every case must also change the plain greedy output, so a transform
that did nothing would fail. Logprobs are the raw model distribution: the sampled token's and
the top 5 equal transformers' ``log_softmax`` at each position within 1e-3.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.engine import Engine
from roundgate.actors.model import gguf_file
from roundgate.actors.model.generation_config import read_generation_config
from roundgate.actors.model.tokenizer import load_tokenizer, stop_token_ids
from roundgate.actors.server_args import ServerArgs

MODEL = "smollm2-135m-instruct"
TOKENS = 10
PROMPTS = ["The capital of France is", "List three colors: red, red, red,"]


class FrequencyPresence:
    """OpenAI's penalty as a transformers logits processor, counted over the output only."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        for token in set(input_ids[0, self.prompt_len :].tolist()):
            count = int((input_ids[0, self.prompt_len :] == token).sum())
            out[0, token] -= count * self.frequency + self.presence
        return out


@pytest.fixture(scope="module")
def engine() -> Engine:
    torch.set_num_threads(1)
    return Engine(ServerArgs(model=MODEL, device="cpu", num_kv_pages=128, max_num_seqs=8))


@pytest.fixture(scope="module")
def reference() -> Any:
    from transformers import AutoModelForCausalLM

    path = gguf_file.packaged_path(MODEL)
    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(MODEL)


@pytest.fixture(scope="module")
def plain(engine: Engine, tokenizer: Any) -> dict[str, list[int]]:
    """Each prompt's plain greedy output (what every transform must change)."""
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    outs = engine.generate(prompts, SamplingParams(max_tokens=TOKENS))
    return dict(zip(PROMPTS, outs, strict=True))


def hf_greedy(reference: Any, ids: list[int], **kwargs: Any) -> list[int]:
    from transformers import LogitsProcessorList

    processors = kwargs.pop("processors", [])
    with torch.inference_mode():
        out = reference.generate(
            torch.tensor([ids]),
            max_new_tokens=TOKENS,
            do_sample=False,
            logits_processor=LogitsProcessorList(processors),
            **{"eos_token_id": None, **kwargs},
        )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize(
    "case", ["repetition", "repetition-below-1", "frequency-presence", "logit-bias"]
)
def test_greedy_with_each_transform_equals_transformers(engine, reference, tokenizer, plain, case):
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        base = plain[prompt]
        if case == "repetition":
            ours, hf = {"repetition_penalty": 1.3}, {"repetition_penalty": 1.3}
        elif case == "repetition-below-1":
            ours, hf = {"repetition_penalty": 0.8}, {"repetition_penalty": 0.8}
        elif case == "frequency-presence":
            ours = {"frequency_penalty": 0.6, "presence_penalty": 0.8}
            hf = {"processors": [FrequencyPresence(len(ids), 0.6, 0.8)]}
        else:  # push the greedy path off its first token and towards another
            bias = ((base[0], -100.0), (base[3], 4.0))
            ours, hf = {"logit_bias": bias}, {"sequence_bias": [[[t], b] for t, b in bias]}
        got = engine.generate([ids], SamplingParams(max_tokens=TOKENS, **ours))[0]
        assert got == hf_greedy(reference, ids, **hf), (case, prompt)
        if case != "repetition-below-1" or prompt == PROMPTS[1]:
            assert got != base, f"{case} changed nothing on {prompt!r}"


def test_min_tokens_equals_transformers_min_new_tokens(engine, reference, tokenizer) -> None:
    ids = tokenizer.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    stops = stop_token_ids(engine.args.model_config, tokenizer, read_generation_config(MODEL))
    plain = engine.generate([ids], SamplingParams(max_tokens=24, stop_token_ids=stops))[0]
    assert len(plain) < TOKENS and plain[-1] in stops  # it would stop early
    sampling = SamplingParams(max_tokens=TOKENS, stop_token_ids=stops, min_tokens=TOKENS)
    got = engine.generate([ids], sampling)[0]
    want = hf_greedy(reference, ids, eos_token_id=list(stops), min_new_tokens=TOKENS)
    assert got == want and len(got) == TOKENS


@pytest.mark.parametrize("penalty", [1.0, 1.5], ids=["plain", "penalised"])
def test_logprobs_are_transformers_log_softmax(engine, reference, tokenizer, penalty) -> None:
    requests = [
        Request(
            f"lp-{penalty}-{i}",
            tokenizer.encode(p),
            SamplingParams(max_tokens=6, logprobs=5, repetition_penalty=penalty),
        )
        for i, p in enumerate(PROMPTS)
    ]
    engine.run(requests)
    for req in requests:
        full = torch.tensor([req.prompt_token_ids + req.output_token_ids])
        with torch.inference_mode():
            logp = torch.log_softmax(reference(full).logits[0].float(), dim=-1)
        start = req.num_prompt_tokens - 1
        assert len(req.output_logprobs) == len(req.output_token_ids) == 6
        for k, (token, lp) in enumerate(
            zip(req.output_token_ids, req.output_logprobs, strict=True)
        ):
            row = logp[start + k]
            assert abs(lp.logprob - row[token].item()) < 1e-3
            top = row.topk(5)
            assert list(lp.top_ids) == top.indices.tolist()
            torch.testing.assert_close(torch.tensor(lp.top_logprobs), top.values, rtol=0, atol=1e-3)
