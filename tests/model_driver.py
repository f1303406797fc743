"""Builders for model tests: tiny HF models on disk and a hand-rolled round loop.

``drive`` plays the scheduler's part with the real ``KVPool`` (pages, chunked prefill,
decodes mixed with prefill chunks) so runner tests do not depend on the scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.request import Request, RequestStatus, SamplingParams
from roundgate.actors.control.round import RoundPlan, ScheduledChunk
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.permission import ALLOW_ALL

# Small enough for milliseconds per forward, big enough for GQA, several pages and experts.
HF_SHAPE = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    # Far from transformers' 0.02 default so top-1 logits have clear margins.
    "initializer_range": 0.2,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def save_tiny_hf_model(kind: str, path: Path, seed: int = 0) -> torch.nn.Module:
    """Build a random ``LlamaForCausalLM`` or ``MixtralForCausalLM``, save it, return it."""
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**HF_SHAPE))
    elif kind == "mixtral":
        config = MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **HF_SHAPE)
        model = MixtralForCausalLM(config)
    else:
        raise ValueError(kind)
    model.eval().save_pretrained(path)
    return model


def make_runner(model: str, page_size: int = 4, num_pages: int = 256, **kw: object) -> ModelRunner:
    args = ServerArgs(model=model, page_size=page_size, num_kv_pages=num_pages, **kw)
    return ModelRunner(args)


def make_requests(prompts: Sequence[list[int]], max_tokens: int = 8) -> list[Request]:
    return [
        Request(f"r{i}", list(p), SamplingParams(max_tokens=max_tokens))
        for i, p in enumerate(prompts)
    ]


def grow_pages(pool: KVPool, request: Request, num_tokens: int) -> None:
    """Make sure ``request`` owns pages for ``num_tokens`` tokens (the scheduler's job)."""
    if pool.extend(request.request_id, num_tokens) is None:
        raise RuntimeError("test KV pool is too small")
    request.page_ids = list(pool.pages_of(request.request_id))


def next_chunk(request: Request, chunk_size: int) -> ScheduledChunk:
    """The request's next prefill chunk, or its decode."""
    if request.num_computed_tokens < request.num_prompt_tokens:
        start = request.num_computed_tokens
        size = min(chunk_size, request.num_prompt_tokens - start)
        return ScheduledChunk(request, start, size, is_prefill=True)
    return ScheduledChunk(request, request.num_tokens - 1, 1, is_prefill=False)


def apply_result(plan: RoundPlan, sampled: dict[str, int]) -> None:
    """What the scheduler does with a RoundResult: advance caches, record tokens."""
    for chunk in plan.chunks:
        request = chunk.request
        request.num_computed_tokens = chunk.end
        if request.request_id in sampled:
            request.append_token(sampled[request.request_id])


def drive(
    runner: ModelRunner,
    pool: KVPool,
    requests: Sequence[Request],
    chunk_size: int = 1 << 30,
) -> list[list[int]]:
    """Run ``requests`` to completion together; every round plans every live request."""
    while True:
        live = [r for r in requests if not r.is_finished]
        if not live:
            return [r.output_token_ids for r in requests]
        chunks = [next_chunk(r, chunk_size) for r in live]
        for chunk in chunks:
            grow_pages(pool, chunk.request, chunk.end)
            chunk.request.status = (
                RequestStatus.PREFILLING if chunk.is_prefill else RequestStatus.DECODING
            )
        plan = RoundPlan(chunks=chunks, permission=ALLOW_ALL)
        apply_result(plan, runner.execute(plan).sampled)


def greedy_step_logits(
    runner: ModelRunner, pool: KVPool, requests: Sequence[Request]
) -> list[torch.Tensor]:
    """Greedy rounds until every request finishes (whole prompt first, then one token a
    round); each round's ``[len(requests), vocab]`` logits, for teacher-forcing checks."""
    steps: list[torch.Tensor] = []
    while not all(r.is_finished for r in requests):
        chunks = []
        for r in requests:
            start = r.num_computed_tokens
            chunks.append(ScheduledChunk(r, start, r.num_tokens - start, start == 0))
            grow_pages(pool, r, chunks[-1].end)
        plan = RoundPlan(chunks=chunks)
        logits = runner.forward(plan)
        steps.append(logits)
        apply_result(plan, {r.request_id: int(logits[i].argmax()) for i, r in enumerate(requests)})
    return steps


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate`` for one prompt, with no stop token."""
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()
