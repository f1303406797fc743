"""The batched transforms against transformers' logits processors, row by row.

A batch mixes rows with different settings (and rows with none): each row must equal what
the transformers processor gives for that row alone, so vectorising over the batch changed
nothing. Presence/frequency penalties are checked against OpenAI's formula, written here.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from roundgate.actors.control.request import SamplingParams
from roundgate.actors.model.logit_transforms import apply_transforms
from roundgate.actors.model.sampling import filter_sorted

VOCAB = 50


def make_case(rows: int, seed: int = 0) -> tuple[torch.Tensor, list[tuple[list[int], list[int]]]]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, generator=gen) * 3
    histories = []
    for i in range(rows):
        prompt = torch.randint(0, VOCAB, (3 + i,), generator=gen).tolist()
        output = torch.randint(0, VOCAB, (2 * i,), generator=gen).tolist()
        histories.append((prompt, output))
    return logits, histories


def frequency_presence(logits, output, frequency, presence):
    """OpenAI's definition: mu[j] - c[j] * alpha_frequency - (c[j] > 0) * alpha_presence."""
    out = logits.clone()
    for token in set(output):
        count = output.count(token)
        out[token] -= count * frequency + (1.0 if count else 0.0) * presence
    return out


ROWS = [
    SamplingParams(),
    SamplingParams(repetition_penalty=1.5),
    SamplingParams(repetition_penalty=0.7),
    SamplingParams(presence_penalty=1.5, frequency_penalty=0.5),
    SamplingParams(frequency_penalty=-1.0),
    SamplingParams(logit_bias=((3, 10.0), (4, -100.0))),
    SamplingParams(min_tokens=5, stop_token_ids=(1, 2), max_tokens=9),
]


def reference(row: int, params: SamplingParams, logits, history, index: int) -> torch.Tensor:
    prompt, output = history
    ids = torch.tensor([prompt + output])
    scores = logits[None].clone()
    if params.logit_bias:
        bias = [[[t], b] for t, b in params.logit_bias]
        scores = SequenceBiasLogitsProcessor(bias)(ids, scores)
    if params.min_tokens:
        proc = MinNewTokensLengthLogitsProcessor(
            ids.shape[1] - index, params.min_tokens, list(params.stop_token_ids)
        )
        scores = proc(ids, scores)
    if params.repetition_penalty != 1:
        scores = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(ids, scores)
    scores = scores[0]
    if params.presence_penalty or params.frequency_penalty:
        scores = frequency_presence(
            scores, output, params.frequency_penalty, params.presence_penalty
        )
    return scores


@pytest.mark.parametrize("seed", [0, 1])
def test_each_row_equals_its_transformers_processor(seed: int) -> None:
    logits, histories = make_case(len(ROWS), seed)
    indices = [len(out) for _, out in histories]
    got = apply_transforms(logits, ROWS, indices, histories)
    for i, params in enumerate(ROWS):
        want = reference(i, params, logits[i], histories[i], indices[i])
        torch.testing.assert_close(got[i], want, rtol=0, atol=1e-5, msg=f"row {i}: {params}")
    assert torch.equal(got[0], logits[0])  # a row with no transform is untouched


def test_min_tokens_mask_lifts_once_reached() -> None:
    logits, histories = make_case(2)
    params = [SamplingParams(min_tokens=3, stop_token_ids=(1,), max_tokens=5)] * 2
    got = apply_transforms(logits, params, [2, 3], histories)
    assert got[0, 1] == float("-inf") and torch.equal(got[1], logits[1])


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "min_p"),
    [(1.0, 0, 1.0, 0.1), (0.7, 10, 0.9, 0.05), (1.5, 0, 0.8, 0.3), (1.0, 5, 1.0, 0.0)],
)
def test_cuts_equal_transformers_warpers(temperature, top_k, top_p, min_p) -> None:
    logits, _ = make_case(4, seed=3)
    scaled = logits / temperature
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    rows = logits.shape[0]
    kept = filter_sorted(
        sorted_logits,
        torch.full((rows,), top_k),
        torch.full((rows,), top_p),
        torch.full((rows,), min_p),
    )
    ours = torch.full_like(logits, float("-inf")).scatter(1, order, kept)
    ids = torch.zeros(rows, 1, dtype=torch.long)
    want = TemperatureLogitsWarper(temperature)(ids, logits.clone())
    if top_k:
        want = TopKLogitsWarper(top_k)(ids, want)
    want = TopPLogitsWarper(top_p)(ids, want)
    if min_p:
        want = MinPLogitsWarper(min_p)(ids, want)
    assert torch.equal(ours.isfinite(), want.isfinite())
    torch.testing.assert_close(torch.softmax(ours, -1), torch.softmax(want, -1))
