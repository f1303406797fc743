"""The offline Engine (real scheduler, chunked prefill, the gate at dp=1) against transformers'
greedy ``generate`` on tiny random Llama and Mixtral models saved with ``save_pretrained``."""

from __future__ import annotations

import pytest
from model_driver import hf_greedy, save_tiny_hf_model

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.server_args import ServerArgs

PROMPTS = [[5, 7, 9], list(range(20, 37)), [3, 1, 4, 1, 5, 9, 2, 6, 5], [250, 11, 42, 42, 7, 8]]


@pytest.fixture(scope="module", params=["llama", "mixtral"])
def model_and_expected(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp(f"engine-{request.param}")
    model = save_tiny_hf_model(request.param, path)
    return str(path), [hf_greedy(model, p, 10) for p in PROMPTS]


@pytest.mark.parametrize(
    "engine_args",
    [
        {"max_scheduled_tokens": 1024},  # whole prompts batched together
        {"max_scheduled_tokens": 5},  # chunked prefill across rounds
        {"max_scheduled_tokens": 7, "enable_mixed_prefill_decode": True},
        {
            "max_scheduled_tokens": 64,
            "prefill_attempt_interval": 2,
            "prefill_any_attempt_interval": 4,
        },  # the gate at dp=1
    ],
)
def test_engine_greedy_equals_transformers(model_and_expected, engine_args) -> None:
    path, expected = model_and_expected
    engine = Engine(
        ServerArgs(model=path, page_size=4, num_kv_pages=256, device="cpu", **engine_args)
    )
    assert engine.generate(PROMPTS, SamplingParams(max_tokens=10)) == expected


def test_engine_refuses_a_group(model_and_expected) -> None:
    with pytest.raises(ValueError, match="--dp-size"):
        Engine(ServerArgs(model=model_and_expected[0], dp_size=2))
