"""Speculative decoding on a real rank (the offline engine over the model runner): n-gram
drafts verified in the decode chunk give the tokens and logprobs of decoding without them
(greedy, seeded sampling with penalties, stop ids, max_tokens, the context's end), while
drafts are really kept; the pool ends exact. The control plane alone (the cost executor,
which keeps no draft) retracts and readmits requests that carry drafts without losing a
computed token."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from builders import make_args, make_request

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.engine import Engine
from roundgate.actors.server_args import ServerArgs
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}
BASE = {
    "model": "tiny-llama",
    "device": "cpu",
    "page_size": 4,
    "num_kv_pages": 512,
    "max_num_seqs": 8,
}


def prompts() -> list[list[int]]:
    """Copy-heavy prompts (a passage, then its start again) and one with nothing to copy."""
    rng = random.Random(0)
    source = [rng.randrange(5, 200) for _ in range(40)]
    fresh = [rng.randrange(5, 200) for _ in range(30)]
    return [source + source[:10], fresh, source[5:30] + source[5:12]]


@pytest.fixture(scope="module")
def engines() -> tuple[Engine, Engine]:
    plain = Engine(ServerArgs(**BASE))
    spec = Engine(ServerArgs(**BASE, speculative_config=json.dumps(SPEC)))
    return plain, spec


def run(engine: Engine, sampling: SamplingParams, ids: list[list[int]] | None = None):
    requests = [Request(f"r{i}", p, sampling) for i, p in enumerate(ids or prompts())]
    engine.run(requests)
    return requests


# A verify chunk's logits come from the extend path, a plain decode's from the decode path:
# the same sums in another order, equal to float32 rounding (measured: 2e-7 relative).
LOGPROB_TOLERANCE = 1e-4


def assert_same_logprobs(have: list, want: list) -> None:
    """The same ranks and top ids, each logprob within ``LOGPROB_TOLERANCE``."""
    assert len(have) == len(want)
    for mine, theirs in zip(have, want, strict=True):
        assert mine.top_ids == theirs.top_ids and mine.rank == theirs.rank
        assert mine.logprob == pytest.approx(theirs.logprob, abs=LOGPROB_TOLERANCE)
        assert mine.top_logprobs == pytest.approx(theirs.top_logprobs, abs=LOGPROB_TOLERANCE)


SAMPLINGS = {
    "greedy": SamplingParams(max_tokens=40, logprobs=3),
    "seeded": SamplingParams(max_tokens=30, temperature=0.9, top_p=0.9, seed=11, logprobs=2),
    "penalties": SamplingParams(
        max_tokens=30,
        temperature=1.0,
        seed=5,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        repetition_penalty=1.2,
        min_tokens=5,
    ),
}


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_speculation_emits_exactly_what_plain_decoding_emits(engines, name: str) -> None:
    plain, spec = engines
    stats = spec.core.scheduler.planner.speculator.stats
    before = stats.drafts
    expected = run(plain, SAMPLINGS[name])
    got = run(spec, SAMPLINGS[name])
    for want, have in zip(expected, got, strict=True):
        assert have.output_token_ids == want.output_token_ids
        assert_same_logprobs(have.output_logprobs, want.output_logprobs)
        assert have.finish_reason == want.finish_reason
    assert stats.drafts > before  # the verify path ran
    pool = spec.core.scheduler.pool
    assert pool.num_used_pages == 0
    pool.check_integrity()


def test_greedy_copy_keeps_drafts(engines) -> None:
    _, spec = engines
    stats = spec.core.scheduler.planner.speculator.stats
    kept, verifies = stats.accepted, stats.verifies
    run(spec, SAMPLINGS["greedy"])
    # tiny-llama's greedy answers repeat themselves: prompt lookup keeps many drafts.
    assert stats.accepted - kept > 10
    assert stats.mean_accepted > 1.0 and stats.verifies > verifies


def test_stop_ids_and_max_tokens_cut_inside_a_verification(engines) -> None:
    plain, spec = engines
    greedy = SamplingParams(max_tokens=40)
    reference = run(plain, greedy)
    # A stop id the greedy answer reaches mid-way, and a max_tokens that lands mid-verification.
    stop = reference[0].output_token_ids[17]
    for sampling in (replace(greedy, stop_token_ids=(stop,)), replace(greedy, max_tokens=13)):
        want = run(plain, sampling)
        have = run(spec, sampling)
        assert [r.output_token_ids for r in have] == [r.output_token_ids for r in want]
        assert [r.finish_reason for r in have] == [r.finish_reason for r in want]


def test_the_context_end_caps_the_drafts() -> None:
    short = {**BASE, "max_model_len": 64}
    plain = Engine(ServerArgs(**short))
    spec = Engine(ServerArgs(**short, speculative_config=json.dumps(SPEC)))
    ids = [prompts()[0]]  # 50 tokens: 14 positions left
    sampling = SamplingParams(max_tokens=1000)
    want, have = run(plain, sampling, ids), run(spec, sampling, ids)
    assert have[0].output_token_ids == want[0].output_token_ids
    assert have[0].finish_reason == want[0].finish_reason == "length"


def test_a_grammar_request_decodes_without_drafts() -> None:
    core = EngineCore(
        make_args(dp_size=1, policy="none", speculative_config=json.dumps(SPEC)),
        CostExecutor(TOY),
    )
    speculator = core.scheduler.planner.speculator
    req = make_request("g", prompt_len=8, max_tokens=8)
    req.output_token_ids = [3, 3, 3]
    assert speculator.drafts_for(req, 10)  # the prompt's 3s repeat: something to propose
    req.sampling = replace(req.sampling, grammar=object())  # type: ignore[arg-type]
    assert speculator.drafts_for(req, 10) == ()


def test_requests_with_drafts_survive_retraction_and_readmission() -> None:
    """A small pool, many repetitive requests: drafts claim pages, retraction takes them back
    (its chunk unplanned with its drafts), and every request still ends with its full answer
    and every page back in the pool. The cost executor keeps no draft, so every
    verification here is a rejection: each round truncates the draft pages again."""
    args = make_args(
        dp_size=1,
        policy="none",
        num_kv_pages=24,
        page_size=4,
        max_num_seqs=8,
        speculative_config=json.dumps({**SPEC, "num_speculative_tokens": 8}),
    )
    core = EngineCore(args, CostExecutor(TOY))
    requests = [make_request(f"r{i}", prompt_len=10, max_tokens=12, token=7) for i in range(6)]
    for req in requests:  # all 7s: prompt lookup always has something to propose
        core.submit(req)
    for _ in range(500):
        if not core.has_local_work:
            break
        core.step()
        core.scheduler.pool.check_integrity()
        for req in core.scheduler.queues.running:
            assert req.num_computed_tokens <= req.num_tokens
    assert all(len(r.output_token_ids) == 12 for r in requests)
    assert core.scheduler.num_retractions > 0
    assert core.scheduler.planner.speculator.stats.drafts > 0
    assert core.scheduler.pool.num_used_pages == 0
