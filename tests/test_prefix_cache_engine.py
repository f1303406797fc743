"""Greedy outputs with prefix caching equal those without, through the offline Engine.

The same conversation runs on two engines, one with ``--enable-prefix-caching`` and one
without: a later turn resends the earlier turns (and their answers), some prompts share a
system prompt in one batch, and one prompt is cached page for page (it recomputes only its
last token, into a copy of its last page). The cached engine must also have reused tokens,
or the comparison would prove nothing.
"""

from __future__ import annotations

import pytest
import torch

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.server_args import ServerArgs

GREEDY = SamplingParams(max_tokens=6)


def conversation(engine: Engine, vocab: int) -> list[list[int]]:
    """Outputs of a fixed multi-turn, shared-prefix script (token ids below ``vocab``)."""
    system = [(7 * i + 3) % vocab for i in range(37)]
    outputs = []
    turn1 = [*system, 11, 12, 13]
    (answer1,) = engine.generate([turn1], GREEDY)
    outputs.append(answer1)
    turn2 = turn1 + answer1 + [21, 22, 23, 24, 25]
    outputs += engine.generate([turn2], GREEDY)
    # One batch: two other users behind the same system prompt, and a page-exact resend.
    batch = [[*system, 31, 32], system + [41] * 9, turn2[:32]]
    outputs += engine.generate(batch, GREEDY)
    outputs += engine.generate([turn2[:32], turn2[:16]], GREEDY)  # fully cached now
    return outputs


def run_both(**flags) -> tuple[list[list[int]], list[list[int]], Engine]:
    torch.set_num_threads(1)
    results = []
    engines = []
    for caching in (True, False):
        engine = Engine(ServerArgs(device="cpu", enable_prefix_caching=caching, **flags))
        results.append(conversation(engine, engine.args.model_config.vocab_size))
        engines.append(engine)
    return results[0], results[1], engines[0]


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-moe", "deepseek_v3"])
def test_tiny_models_answer_the_same_with_and_without_caching(model: str, tmp_path) -> None:
    """The presets, and a tiny DeepSeek-V3 whose pages hold MLA's latent entries."""
    if model == "deepseek_v3":
        from family_models import build_family

        build_family(model).save_pretrained(tmp_path)
        model = str(tmp_path)
    cached, plain, engine = run_both(model=model, num_kv_pages=64)
    assert cached == plain
    prefix = engine.core.scheduler.prefix
    assert prefix.num_hits > 0 and prefix.num_hits < prefix.num_queries


def test_the_default_model_answers_the_same_with_and_without_caching() -> None:
    cached, plain, engine = run_both(model="smollm2-135m-instruct", num_kv_pages=64)
    assert cached == plain
    # turn 2: two pages; the batch: two each behind the system prompt, 31 of the resend;
    # then 31 and 15 of the two fully cached prompts.
    assert engine.core.scheduler.prefix.num_hits == 32 + 2 * 32 + 31 + 31 + 15
