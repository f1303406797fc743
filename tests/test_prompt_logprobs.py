"""Prompt logprobs through the real scheduler and runner against transformers' logits.

A tiny random Llama (saved with ``save_pretrained``) runs on the offline ``Engine``: prompts
longer than one chunk (chunked prefill), a prompt whose prefix another request just cached
(that request recomputes it: cached pages have no logits), and rounds where requests that do
not ask share the batch. The default model's check is ``test_default_model_prompt_logprobs``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_driver import save_tiny_hf_model

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.round import ScheduledChunk
from roundgate.actors.engine import Engine
from roundgate.actors.model.prompt_logprobs import prompt_rows
from roundgate.actors.server_args import ServerArgs

ATOL = 2e-4
PREFIX = list(range(40, 66))  # 26 tokens: six full pages of 4 and part of a seventh
PROMPTS = [[*PREFIX, 7, 9, 11], [5, 3], list(range(100, 131))]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    path = tmp_path_factory.mktemp("llama")
    return save_tiny_hf_model("llama", path), path


def make_engine(path: Path, **kw: object) -> Engine:
    args = ServerArgs(model=str(path), page_size=4, num_kv_pages=128, max_scheduled_tokens=8, **kw)
    return Engine(args)


def reference(model: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    """transformers' log-softmax at every prompt position, ``[len(prompt), vocab]``."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def check_against(model: torch.nn.Module, req: Request, k: int) -> None:
    """Every prompt token from the second on: its logprob, rank and the top ``k``."""
    prompt = req.prompt_token_ids
    want = reference(model, prompt)
    assert len(req.prompt_logprobs) == len(prompt) - 1
    for p, entry in enumerate(req.prompt_logprobs):
        row = want[p]
        target = prompt[p + 1]
        assert entry.logprob == pytest.approx(float(row[target]), abs=ATOL)
        assert entry.rank == int((row > row[target]).sum()) + 1
        top_lp, top_ids = row.topk(k)
        assert list(entry.top_logprobs) == pytest.approx(top_lp.tolist(), abs=ATOL)
        assert list(entry.top_ids) == top_ids.tolist()


@pytest.mark.parametrize("k", [0, 5])
def test_every_prompt_token_equals_transformers_through_chunked_prefill(model, k: int) -> None:
    hf, path = model
    engine = make_engine(path)
    # One asks, two do not: they share the rounds (mixed rows in one forward).
    asks = Request("asks", PROMPTS[2], SamplingParams(max_tokens=2, prompt_logprobs=k))
    others = [Request(f"o{i}", p, SamplingParams(max_tokens=3)) for i, p in enumerate(PROMPTS[:2])]
    engine.run([asks, *others])
    check_against(hf, asks, k)
    assert all(not r.prompt_logprobs for r in others)
    # Chunked: 31 tokens at 8 a round took four prefill rounds.
    assert len(PROMPTS[2]) > 8


def test_a_cached_prefix_is_recomputed_for_a_request_that_asks(model) -> None:
    hf, path = model
    engine = make_engine(path)
    engine.run([Request("warm", PREFIX, SamplingParams(max_tokens=1))])
    prefix = engine.core.scheduler.prefix
    hits = prefix.num_hits
    plain = Request("plain", PROMPTS[0], SamplingParams(max_tokens=1))
    engine.run([plain])
    assert prefix.num_hits > hits  # the prefix is cached: a plain request reuses it
    hits = prefix.num_hits
    asks = Request("asks", PROMPTS[0], SamplingParams(max_tokens=1, prompt_logprobs=3))
    engine.run([asks])
    assert prefix.num_hits == hits  # ... and one that asks recomputes it
    check_against(hf, asks, 3)
    assert asks.output_token_ids == plain.output_token_ids


def test_a_prompt_of_one_token_has_no_entries(model) -> None:
    _, path = model
    engine = make_engine(path)
    req = Request("one", [42], SamplingParams(max_tokens=1, prompt_logprobs=2))
    engine.run([req])
    assert req.prompt_logprobs == [] and len(req.output_token_ids) == 1


def test_rows_are_found_only_for_prefill_chunks_that_ask() -> None:
    asks = Request("a", list(range(10)), SamplingParams(prompt_logprobs=1))
    plain = Request("b", list(range(10)))
    chunks = [
        ScheduledChunk(plain, 0, 4, True),
        ScheduledChunk(asks, 4, 6, True),  # positions 4..9 score tokens 5..9 (not 10)
    ]
    found = prompt_rows(chunks)
    assert found is not None
    assert found.rows == [4, 5, 6, 7, 8] and found.targets == [5, 6, 7, 8, 9]
    assert found.owners == [("a", 0, 5, 1)]
    assert prompt_rows([ScheduledChunk(plain, 0, 10, True)]) is None


def test_prompt_logprobs_below_zero_or_past_the_vocabulary_are_refused() -> None:
    """The deployment's ``max_logprobs`` is the ingress's check; a rank refuses only what it
    cannot compute: a negative count, or more entries than the vocabulary has."""
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
    SamplingParams(prompt_logprobs=21).check_vocab(21)
    with pytest.raises(ValueError, match="prompt_logprobs: 22 exceeds the vocabulary size 21"):
        SamplingParams(prompt_logprobs=22).check_vocab(21)
    with pytest.raises(ValueError, match="logprobs: 22 exceeds"):
        SamplingParams(logprobs=22).check_vocab(21)
