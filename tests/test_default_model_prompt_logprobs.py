"""Prompt logprobs on the default model (SmolLM2-135M-Instruct, its packaged GGUF) equal
transformers' on the same file: every prompt token's logprob, its rank and the top-k
alternatives, for a prompt longer than one prefill chunk and for one whose prefix is cached.
"""

from __future__ import annotations

import pytest
import torch

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.engine import Engine
from roundgate.actors.model import gguf_file
from roundgate.actors.model.tokenizer import load_tokenizer
from roundgate.actors.server_args import ServerArgs

MODEL = "smollm2-135m-instruct"
ATOL = 1e-3
K = 5
CHUNK = 16  # tokens a round: the long prompt below (37 tokens) needs three prefill rounds
PREFIX = (
    "Question: Which planet is known as the red planet, and why does it look red from Earth? "
    "Answer:"
)
LONG = PREFIX + " Mars, because iron oxide dust covers its surface and scatters red light."


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    path = gguf_file.packaged_path(MODEL)
    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def engine() -> Engine:
    torch.set_num_threads(1)
    args = ServerArgs(
        model=MODEL, device="cpu", num_kv_pages=64, max_num_seqs=4, max_scheduled_tokens=CHUNK
    )
    return Engine(args)


def check(reference: torch.nn.Module, req: Request) -> None:
    ids = req.prompt_token_ids
    with torch.inference_mode():
        logits = reference(torch.tensor([ids])).logits[0].float()
    want = torch.log_softmax(logits, dim=-1)
    assert len(req.prompt_logprobs) == len(ids) - 1
    for p, entry in enumerate(req.prompt_logprobs):
        row, target = want[p], ids[p + 1]
        assert entry.logprob == pytest.approx(float(row[target]), abs=ATOL), p
        top_lp, top_ids = row.topk(K)
        assert list(entry.top_logprobs) == pytest.approx(top_lp.tolist(), abs=ATOL), p
        # Ties within float noise may swap places; the ids must agree where values differ.
        for i, (ours, theirs) in enumerate(zip(entry.top_ids, top_ids.tolist(), strict=True)):
            if ours != theirs:
                assert abs(float(row[ours]) - float(top_lp[i])) < ATOL, p
        near = ((row - row[target]).abs() < ATOL).sum()
        assert abs(entry.rank - (int((row > row[target]).sum()) + 1)) < near, p


def test_a_prompt_longer_than_a_chunk_equals_transformers(reference, engine) -> None:
    ids = load_tokenizer(MODEL).encode(LONG)
    assert len(ids) > 2 * CHUNK
    req = Request("long", ids, SamplingParams(max_tokens=1, prompt_logprobs=K))
    engine.run([req])
    check(reference, req)


def test_a_cached_prefix_is_recomputed_and_equals_transformers(reference, engine) -> None:
    tokenizer = load_tokenizer(MODEL)
    engine.run([Request("warm", tokenizer.encode(PREFIX), SamplingParams(max_tokens=1))])
    prefix = engine.core.scheduler.prefix
    ids = tokenizer.encode(LONG)
    plain = Request("plain", ids, SamplingParams(max_tokens=1))
    hits = prefix.num_hits
    engine.run([plain])
    assert prefix.num_hits > hits, "the prefix must be cached for this test to mean anything"
    hits = prefix.num_hits
    req = Request("cached", ids, SamplingParams(max_tokens=1, prompt_logprobs=K))
    engine.run([req])
    assert prefix.num_hits == hits
    check(reference, req)
