"""Every new family against transformers' own class: same weights, same prompts -> the same
logits (float32 tolerance) and the same greedy tokens.

Models are built with transformers (``tests/family_models.py``), saved with
``save_pretrained`` and loaded by the runner from disk: ragged prompts batched together,
chunked prefill whose chunks straddle 4-token pages, decodes mixed into prefill rounds.
"""

from __future__ import annotations

import pytest
import torch
from family_models import FAMILIES, build_family
from model_driver import (
    drive,
    greedy_step_logits,
    grow_pages,
    hf_greedy,
    make_requests,
    make_runner,
)

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.round import RoundPlan, ScheduledChunk
from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.server_args import ServerArgs

PROMPTS = [[5, 7, 9], list(range(20, 37)), [3, 1, 4, 1, 5, 9, 2, 6, 5], [250, 11, 42, 42, 7, 8]]
ATOL = 2e-4

# What each tiny model must exercise, read back from the engine's own config.
FEATURES = {
    "qwen2": lambda c: c.qkv_bias and not c.attention_bias,
    "qwen3": lambda c: c.qk_norm and c.head_dim == 24 and c.q_size != c.hidden_size,
    "qwen2_moe": lambda c: c.shared_expert_gate and c.dense_layers == (1,),
    "qwen3_moe": lambda c: c.dense_layers == (0, 2, 3) and c.router.norm_topk_prob,
    "deepseek_v3": lambda c: (
        c.mla.q_lora_rank == 24
        and c.rope_scaling.kind == "yarn"
        and c.router.scoring == "sigmoid"
        and c.router.n_group == 4
        and c.dense_layers == (0,)
        and c.shared_expert_intermediate_size == 32
    ),
    "deepseek_v2": lambda c: (
        c.mla.q_lora_rank is None
        and c.router.topk_method == "group_limited_greedy"
        and c.router.routed_scaling_factor == 1.5
        and c.dense_layers == ()
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """``(name, transformers model, saved dir, its greedy continuations of PROMPTS)``."""
    model = build_family(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, str(path), [hf_greedy(model, p, 8) for p in PROMPTS]


def hf_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def test_the_model_exercises_its_family(family) -> None:
    name, _, path, _ = family
    config = make_runner(path, num_pages=8).config
    assert config.architecture == type(family[1]).__name__
    assert FEATURES[name](config)


def test_batched_ragged_prefill_logits_match(family) -> None:
    _, model, path, _ = family
    runner, pool = make_runner(path), KVPool(PoolConfig(256, 4))
    requests = make_requests(PROMPTS)
    for r in requests:
        grow_pages(pool, r, r.num_tokens)
    logits = runner.forward(
        RoundPlan(chunks=[ScheduledChunk(r, 0, r.num_tokens, True) for r in requests])
    )
    for row, prompt in enumerate(PROMPTS):
        torch.testing.assert_close(logits[row], hf_logits(model, prompt)[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("chunk_size", [1 << 30, 5, 3], ids=["whole", "chunk5", "chunk3"])
def test_greedy_matches_transformers(family, chunk_size: int) -> None:
    _, _, path, expected = family
    runner, pool = make_runner(path), KVPool(PoolConfig(256, 4))
    outputs = drive(runner, pool, make_requests(PROMPTS, max_tokens=8), chunk_size=chunk_size)
    assert outputs == expected


def test_decode_logits_match_teacher_forcing(family) -> None:
    """Every decode step (MLA: the absorbed path over the cached latent) equals
    transformers' full forward over the same tokens."""
    _, model, path, _ = family
    runner, pool = make_runner(path), KVPool(PoolConfig(256, 4))
    requests = make_requests(PROMPTS, max_tokens=5)
    steps = greedy_step_logits(runner, pool, requests)
    for i, r in enumerate(requests):
        full = hf_logits(model, r.prompt_token_ids + r.output_token_ids[:-1])
        ours = torch.stack([s[i] for s in steps])
        torch.testing.assert_close(ours, full[r.num_prompt_tokens - 1 :], atol=ATOL, rtol=0)


def test_engine_with_the_scheduler_matches(family) -> None:
    """The offline Engine (real scheduler, chunked prefill of 5 tokens, 4-token pages)."""
    _, _, path, expected = family
    args = ServerArgs(model=path, page_size=4, num_kv_pages=128, max_scheduled_tokens=5)
    assert Engine(args).generate(PROMPTS, SamplingParams(max_tokens=8)) == expected
