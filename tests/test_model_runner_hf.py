"""ModelRunner against transformers: same weights, same prompts -> same logits and tokens.

Tiny random Llama/Mixtral models are built and saved with ``save_pretrained`` (offline), then
loaded by the runner from disk; pages of 4 tokens so every sequence spans many pages.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from model_driver import (
    HF_SHAPE,
    apply_result,
    drive,
    greedy_step_logits,
    grow_pages,
    hf_greedy,
    make_requests,
    make_runner,
    save_tiny_hf_model,
)

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.round import RoundPlan, ScheduledChunk
from roundgate.actors.model.config import PRESETS
from roundgate.actors.model.weights import random_hf_state, save_hf_dir

PROMPTS = [[5, 7, 9], list(range(20, 37)), [3, 1, 4, 1, 5, 9, 2, 6, 5], [250, 11, 42, 42, 7, 8]]
ATOL = 2e-4
# Scaled RoPE with a short original context so the scaling changes every frequency band.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
YARN_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
}


@pytest.fixture(scope="module", params=["llama", "mixtral"])
def hf_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp(request.param)
    return save_tiny_hf_model(request.param, path), path


@pytest.fixture(scope="module")
def hf_outputs(hf_model) -> list[list[int]]:
    """transformers' greedy continuations of PROMPTS (10 tokens), computed once per model."""
    return [hf_greedy(hf_model[0], p, 10) for p in PROMPTS]


def hf_last_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def test_batched_ragged_prefill_logits_match(hf_model) -> None:
    model, path = hf_model
    runner, pool = make_runner(str(path)), KVPool(PoolConfig(256, 4))
    requests = make_requests(PROMPTS)
    for r in requests:
        grow_pages(pool, r, r.num_tokens)
    plan = RoundPlan(chunks=[ScheduledChunk(r, 0, r.num_tokens, True) for r in requests])
    logits = runner.forward(plan)
    for row, prompt in enumerate(PROMPTS):
        torch.testing.assert_close(
            logits[row], hf_last_logits(model, prompt)[-1], atol=ATOL, rtol=0
        )


@pytest.mark.parametrize(
    ("chunk_size", "page_size"),
    [
        (1 << 30, 4),  # whole prompts in one round
        (5, 4),  # chunked prefill, chunks straddle page boundaries, mixed rounds
        (3, 1),  # one token a page
        (4, 16),  # several chunks inside one page
    ],
)
def test_greedy_matches_transformers_generate(
    hf_model, hf_outputs, chunk_size: int, page_size: int
) -> None:
    path = hf_model[1]
    runner, pool = make_runner(str(path), page_size=page_size), KVPool(PoolConfig(256, page_size))
    outputs = drive(runner, pool, make_requests(PROMPTS, max_tokens=10), chunk_size=chunk_size)
    assert outputs == hf_outputs


def test_step_decode_logits_match_teacher_forcing(hf_model) -> None:
    """Every decode step's logits equal transformers' full forward over the same tokens."""
    model, path = hf_model
    runner, pool = make_runner(str(path)), KVPool(PoolConfig(256, 4))
    requests = make_requests(PROMPTS, max_tokens=6)
    step_logits = greedy_step_logits(runner, pool, requests)
    for i, r in enumerate(requests):
        full = hf_last_logits(model, r.prompt_token_ids + r.output_token_ids[:-1])
        ours = torch.stack([s[i] for s in step_logits])
        torch.testing.assert_close(ours, full[r.num_prompt_tokens - 1 :], atol=ATOL, rtol=0)


def test_retract_and_readmit_restores_the_cache(hf_model, hf_outputs) -> None:
    """KV parked off-device and restored into other pages gives the uninterrupted output."""
    path = hf_model[1]
    runner, pool = make_runner(str(path)), KVPool(PoolConfig(64, 4))
    victim, other = make_requests(PROMPTS[1:3], max_tokens=10)
    plan = RoundPlan(chunks=[ScheduledChunk(victim, 0, victim.num_tokens, True)])
    grow_pages(pool, victim, victim.num_tokens)
    apply_result(plan, runner.execute(plan).sampled)

    old_pages = list(victim.page_ids)
    pool.free(victim.request_id)
    # The other request takes the freed pages and overwrites them.
    grow_pages(pool, other, other.num_tokens)
    assert set(old_pages) & set(other.page_ids)
    plan = RoundPlan(
        chunks=[ScheduledChunk(other, 0, other.num_tokens, True)], retracted=[(victim, old_pages)]
    )
    apply_result(plan, runner.execute(plan).sampled)

    grow_pages(pool, victim, victim.num_tokens)
    assert victim.page_ids != old_pages
    runner.execute(RoundPlan(readmitted=[victim]))
    outputs = drive(runner, pool, [victim, other])
    assert outputs == hf_outputs[1:3]
    assert runner.parked == {}


@pytest.mark.parametrize(
    "variant",
    [
        {"tie_word_embeddings": True},
        {"attention_bias": True, "mlp_bias": True},
        {"head_dim": 8},
        {"rope_parameters": LLAMA3_ROPE},
        {"rope_parameters": YARN_ROPE},
    ],
    ids=["tied", "biases", "narrow-heads", "llama3-rope", "yarn-rope"],
)
def test_llama_variants_match(variant: dict, tmp_path: Path) -> None:
    """Config switches the loader must honour: tied lm_head, biases, head_dim != H / heads,
    llama3 and yarn RoPE scaling (yarn: its attention factor on cos/sin too)."""
    torch.manual_seed(1)
    config = transformers.LlamaConfig(**{**HF_SHAPE, **variant})
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    runner, pool = make_runner(str(tmp_path)), KVPool(PoolConfig(256, 4))
    requests = make_requests(PROMPTS)
    for r in requests:
        grow_pages(pool, r, r.num_tokens)
    logits = runner.forward(
        RoundPlan(chunks=[ScheduledChunk(r, 0, r.num_tokens, True) for r in requests])
    )
    for row, prompt in enumerate(PROMPTS):
        torch.testing.assert_close(
            logits[row], hf_last_logits(model, prompt)[-1], atol=ATOL, rtol=0
        )


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_match_transformers_on_their_export(preset: str, tmp_path: Path) -> None:
    """A preset exported as an HF directory loads in transformers and generates the same."""
    config = PRESETS[preset]
    path = save_hf_dir(config, random_hf_state(config, seed=0), tmp_path / preset)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    runner, pool = make_runner(preset), KVPool(PoolConfig(256, 4))
    outputs = drive(runner, pool, make_requests(PROMPTS, max_tokens=5), chunk_size=7)
    assert outputs == [hf_greedy(model, p, 5) for p in PROMPTS]


def test_a_readmitted_decode_planned_in_its_readmission_round_restores() -> None:
    """A request readmitted and decoded in the same round counts that decode's token as
    computed before the forward writes it: the restore must ask only for the parked tokens'
    pages (it once refused, "readmitted into 11 pages, needs 11 for 41 cached tokens"), and
    the pressured run's greedy tokens equal an unpressured one's."""
    from roundgate.actors.engine import Engine, SamplingParams
    from roundgate.actors.server_args import ServerArgs

    prompts = [list(range(1 + i, 30 + i)) for i in range(4)]
    outputs = []
    for pages in (20, 256):
        args = ServerArgs(
            model="tiny-llama", page_size=4, num_kv_pages=pages, max_scheduled_tokens=16
        )
        engine = Engine(args)
        outputs.append(engine.generate(prompts, SamplingParams(max_tokens=30)))
        if pages == 20:
            assert engine.core.scheduler.num_retractions > 0
    assert outputs[0] == outputs[1]
