"""``speculative_config`` method ``mtp``: DeepSeek-V3's next-n layer drafting on the rank.

The layer's drafts are checked against a cache-free reference of the next-n computation built
from transformers' own modules (``mtp_models.reference_next_n_logits``) at every position the
engine drafted from, across chunked prefills and verify rounds; the engine's output with MTP
equals its output without, greedy and seeded; and the refusals name their field.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from mtp_models import reference_next_n_logits, save_deepseek_with_next_n

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.round import ScheduledChunk
from roundgate.actors.engine import Engine
from roundgate.actors.model.mtp import next_tokens
from roundgate.actors.server_args import ServerArgs

MTP = {"method": "mtp", "num_speculative_tokens": 1}
PROMPTS = [[5, 7, 9], list(range(20, 37)), [250, 11, 42, 42, 7, 8]]
TOKENS = 14
# The chunk budget splits the 17-token prompt over rounds (the next-n layer then reads the
# next chunk's first token at a chunk's end) and mixes prefill chunks with decodes.
BASE = {"page_size": 4, "num_kv_pages": 256, "max_scheduled_tokens": 7}


@pytest.fixture(scope="module", params=["random", "per_token"])
def checkpoint(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    path = tmp_path_factory.mktemp(f"deepseek-mtp-{request.param}")
    parts = save_deepseek_with_next_n(path, per_token=request.param == "per_token")
    yield str(path), parts, request.param


def drafting_engine(model: str) -> tuple[Engine, list[tuple[str, int, torch.Tensor]]]:
    """An MTP engine recording (request id, position, logits) of every draft it makes."""
    engine = Engine(ServerArgs(model=model, **BASE, speculative_config=MTP))
    drafter = engine.runner.drafter
    made: list[tuple[str, int, torch.Tensor]] = []
    inner = drafter.draft_logits

    def recording(chunks, sampled, accepted):  # type: ignore[no-untyped-def]
        rows, logits = inner(chunks, sampled, accepted)
        for chunk in chunks:
            rid = chunk.request.request_id
            if rid in rows:
                kept = len(accepted.get(rid, ()))
                last = chunk.end - 1 if chunk.is_prefill else chunk.start + kept
                made.append((rid, last, logits[list(rows).index(rid)].clone()))
        return rows, logits

    drafter.draft_logits = recording
    return engine, made


def test_drafts_equal_the_reference_and_outputs_equal_plain_decoding(checkpoint: tuple) -> None:
    model, parts, kind = checkpoint
    plain = Engine(ServerArgs(model=model, **BASE)).generate(
        PROMPTS, SamplingParams(max_tokens=TOKENS)
    )
    engine, made = drafting_engine(model)
    drafted = engine.generate(PROMPTS, SamplingParams(max_tokens=TOKENS))
    assert drafted == plain
    ids = {f"offline-{i}": p + out for i, (p, out) in enumerate(zip(PROMPTS, drafted, strict=True))}
    reference = {rid: reference_next_n_logits(parts, seq) for rid, seq in ids.items()}
    # A draft at every prompt's end and after every decode round of every request.
    assert len(made) >= sum(len(out) for out in drafted) // 2
    for rid, position, logits in made:
        expected = reference[rid][position]
        torch.testing.assert_close(logits, expected, atol=2e-4, rtol=2e-4)
        assert int(logits.argmax()) == int(expected.argmax()), (rid, position)
    stats = engine.core.scheduler.planner.speculator.stats
    assert stats.verifies > 0
    if kind == "per_token":  # its next-n layer is always right: every draft kept
        assert stats.accepted == stats.drafts > 0
    # The K/V of the next-n layer: one more cache layer, counted in the per-token bytes.
    config = engine.runner.config
    assert config.draft_layers == 1
    assert config.kv_bytes_per_token(4) == 4 * 4 * config.mla.latent_width


def test_seeded_sampling_is_unchanged_by_drafts(checkpoint: tuple) -> None:
    model, _, _ = checkpoint
    params = [SamplingParams(max_tokens=10, temperature=0.8, seed=7 + i) for i in range(3)]
    plain = Engine(ServerArgs(model=model, **BASE)).generate(PROMPTS, params)
    drafted = Engine(ServerArgs(model=model, **BASE, speculative_config=MTP)).generate(
        PROMPTS, params
    )
    assert drafted == plain


def _request(prompt: list[int], output: list[int], drafts: tuple[int, ...] = ()) -> Request:
    req = Request("r", prompt, SamplingParams(max_tokens=32))
    req.output_token_ids.extend(output)
    req.drafts = drafts
    return req


@pytest.mark.parametrize(
    ("chunk", "sampled", "accepted", "tokens", "rows"),
    [
        # A prompt's middle chunk: the next prompt token closes it; nothing sampled.
        (ScheduledChunk(_request([1, 2, 3, 4, 5], []), 0, 3, True), {}, {}, [2, 3, 4], {}),
        # Its last chunk: the sampled token follows the last prompt token; a draft there.
        (ScheduledChunk(_request([1, 2, 3, 4, 5], []), 3, 2, True), {"r": 9}, {}, [5, 9], {"r": 1}),
        # A decode: the sampled token follows it.
        (ScheduledChunk(_request([1, 2], [3]), 2, 1, False), {"r": 4}, {}, [4], {"r": 0}),
        # A verify of [3, 6] that kept its draft: 6, then the sampled token; read at the draft.
        (
            ScheduledChunk(_request([1, 2], [3], (6,)), 2, 2, False),
            {"r": 8},
            {"r": (6,)},
            [6, 8],
            {"r": 1},
        ),
        # One that rejected it: the sampled token follows the last token; read there.
        (ScheduledChunk(_request([1, 2], [3], (6,)), 2, 2, False), {"r": 8}, {}, [8, 0], {"r": 0}),
        # A failed request (no token): nothing drafted, its positions padded.
        (ScheduledChunk(_request([1, 2], [3]), 2, 1, False), {}, {}, [0], {}),
    ],
)
def test_next_tokens(chunk, sampled, accepted, tokens, rows) -> None:  # type: ignore[no-untyped-def]
    assert next_tokens([chunk], sampled, accepted) == (tokens, rows)


def test_rows_are_flattened_across_chunks() -> None:
    a = ScheduledChunk(_request([1, 2, 3], []), 0, 3, True)
    b = ScheduledChunk(_request([1, 2], [3], (6, 7)), 2, 3, False)
    b.request.request_id = "s"
    tokens, rows = next_tokens([a, b], {"r": 4, "s": 5}, {"s": (6,)})
    assert tokens == [2, 3, 4, 6, 5, 0]
    assert rows == {"r": 2, "s": 4}


@pytest.mark.parametrize(
    ("model", "spec", "args", "message"),
    [
        ("tiny-llama", MTP, {}, "num_nextn_predict_layers 0"),
        (None, {**MTP, "num_speculative_tokens": 2}, {}, "num_speculative_tokens must be 1"),
        (None, MTP, {"disaggregation_mode": "decode"}, "disaggregation-mode decode"),
    ],
)
def test_refusals_name_the_field(
    checkpoint: tuple, model: str | None, spec: dict, args: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ServerArgs(model=model or checkpoint[0], speculative_config=spec, **args)


def test_a_checkpoint_without_the_layer_loads_as_before(tmp_path: Path) -> None:
    """The next-n tensors are not read (and not refused) unless ``mtp`` asks for them."""
    path = tmp_path / "m"
    save_deepseek_with_next_n(path)
    args = ServerArgs(model=str(path), **BASE)
    assert args.model_config.num_nextn_predict_layers == 1
    assert args.model_config.draft_layers == 0
    engine = Engine(args)
    assert engine.runner.drafter is None
    assert len(engine.generate([[5, 7, 9]], SamplingParams(max_tokens=3))[0]) == 3
