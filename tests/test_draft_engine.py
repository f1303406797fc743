"""``speculative_config`` method ``draft_model`` in the engine: a small model on the rank
drafts for the round's verification (``drafters.DraftModelDrafter``).

Output equals decoding without drafts, greedy and seeded, whether the draft is the target's
exact copy (every draft kept) or another model of the same vocabulary (most rejected); the
drafts a verification carries are the draft model's own greedy continuation; refusals name
``speculative_config.model`` before any rank starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_driver import HF_SHAPE

from roundgate.actors.control.request import SamplingParams
from roundgate.actors.engine import Engine
from roundgate.actors.server_args import ServerArgs

PROMPTS = [[5, 7, 9, 5, 7], list(range(20, 37)), [250, 11, 42, 42, 7, 8]]
BASE = {"model": "tiny-llama", "page_size": 4, "num_kv_pages": 256, "max_scheduled_tokens": 9}


def spec(draft: str, k: int = 3) -> dict[str, object]:
    return {"method": "draft_model", "model": draft, "num_speculative_tokens": k}


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random one-layer Llama of the preset's vocabulary: a poor draft for it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    shape = {**HF_SHAPE, "vocab_size": 512, "num_hidden_layers": 1, "hidden_size": 32}
    path = tmp_path_factory.mktemp("draft-llama")
    LlamaForCausalLM(LlamaConfig(**shape, head_dim=8)).eval().save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("draft", ["tiny-llama", "other"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_output_equals_plain_decoding(draft: str, k: int, other_draft: str) -> None:
    model = other_draft if draft == "other" else draft
    params = SamplingParams(max_tokens=16)
    plain = Engine(ServerArgs(**BASE)).generate(PROMPTS, params)
    engine = Engine(ServerArgs(**BASE, speculative_config=spec(model, k)))
    assert engine.generate(PROMPTS, params) == plain
    stats = engine.core.scheduler.planner.speculator.stats
    assert stats.verifies > 0
    if draft == "tiny-llama":  # the preset with the target's seed: an exact copy of it
        assert stats.accepted == stats.drafts
        assert stats.mean_accepted > 1 + (k - 1) / 2
    else:
        assert stats.accepted < stats.drafts


def test_seeded_sampling_is_unchanged(other_draft: str) -> None:
    params = [SamplingParams(max_tokens=12, temperature=0.9, seed=11 + i) for i in range(3)]
    plain = Engine(ServerArgs(**BASE)).generate(PROMPTS, params)
    for draft in ("tiny-llama", other_draft):
        drafted = Engine(ServerArgs(**BASE, speculative_config=spec(draft))).generate(
            PROMPTS, params
        )
        assert drafted == plain


def test_verified_drafts_are_the_draft_models_greedy_continuation(other_draft: str) -> None:
    """What a verification carries is what the draft model, run alone from scratch over the
    request's history at that round, would greedily write next."""
    engine = Engine(ServerArgs(**BASE, speculative_config=spec(other_draft)))
    drafter = engine.runner.drafter
    seen: list[tuple[list[int], tuple[int, ...]]] = []
    inner = drafter.draft

    def recording(chunks, sampled, accepted):  # type: ignore[no-untyped-def]
        out = inner(chunks, sampled, accepted)
        for chunk in chunks:
            rid = chunk.request.request_id
            if rid in out:
                history = chunk.request.token_ids(0, chunk.request.num_tokens)
                seen.append(([*history, *accepted.get(rid, ()), sampled[rid]], out[rid]))
        return out

    drafter.draft = recording
    engine.generate(PROMPTS, SamplingParams(max_tokens=10))
    assert len(seen) >= 10
    draft = drafter.model
    for history, drafts in seen:
        sequence = list(history)
        for _ in drafts:
            sequence.append(int(draft.logits(sequence)[-1].argmax()))
        assert tuple(sequence[len(history) :]) == drafts


@pytest.mark.parametrize(
    ("draft", "message"),
    [
        ("tiny-moe", "speculative_config.model 'tiny-moe': a MoE draft"),
        ("/no/such/model", "speculative_config.model '/no/such/model'"),
    ],
)
def test_a_bad_draft_is_refused_naming_the_field(draft: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerArgs(**BASE, speculative_config=spec(draft))


def test_a_draft_of_another_vocabulary_is_refused(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(**{**HF_SHAPE, "num_hidden_layers": 1})).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"speculative_config.model .*vocabulary"):
        ServerArgs(**BASE, speculative_config=spec(str(tmp_path)))


def test_a_failing_draft_model_costs_drafts_not_answers() -> None:
    params = SamplingParams(max_tokens=8)
    plain = Engine(ServerArgs(**BASE)).generate(PROMPTS, params)
    engine = Engine(ServerArgs(**BASE, speculative_config=spec("tiny-llama")))

    def broken(*_: object) -> dict[str, tuple[int, ...]]:
        raise RuntimeError("draft forward failed")

    engine.runner.drafter.model.propose = broken  # type: ignore[method-assign]
    assert engine.generate(PROMPTS, params) == plain
    assert engine.core.scheduler.planner.speculator.stats.verifies == 0
