"""``n > 1``: one prefill, n sequences, each equal to the same request run alone as that
sequence (its own seeded stream), on the real scheduler and runner with a tiny Llama.

Forked sequences enter through readmission with a copy of the prompt's KV, so a wrong copy
or a wrong seed would show as a sequence that differs from its solo run.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from model_driver import save_tiny_hf_model

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.engine import Engine
from roundgate.actors.server_args import ServerArgs

PROMPT = list(range(20, 31))  # 11 tokens: several pages, one partly filled


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("n-llama")
    save_tiny_hf_model("llama", path)
    return str(path)


def run_n(engine: Engine, sampling: SamplingParams) -> tuple[dict[int, list[int]], int, dict]:
    """Tokens per sequence index, prompt tokens prefilled, and each sequence's finish."""
    events = defaultdict(list)
    finishes = {}

    def on_event(event) -> None:
        if event.token_id is not None:
            events[event.request.index].append(event.token_id)
        if event.finished:
            finishes[event.request.index] = event.request.finish_reason

    engine.core.on_event = on_event
    engine.core.submit(Request("n-req", list(PROMPT), sampling))
    prefilled = 0
    while engine.core.has_local_work:
        prefilled += engine.core.step().plan.num_prefill_tokens
    engine.core.on_event = None
    return dict(events), prefilled, finishes


@pytest.mark.parametrize(
    ("sampling", "page_size"),
    [
        (SamplingParams(max_tokens=9, temperature=1.0, seed=7, n=4), 4),
        (SamplingParams(max_tokens=6, temperature=0.8, top_k=20, seed=3, n=3), 8),
        (SamplingParams(max_tokens=5, n=2, logprobs=2), 4),  # greedy: all sequences agree
    ],
)
def test_each_sequence_equals_its_solo_run_and_the_prompt_is_prefilled_once(
    model_path: str, sampling: SamplingParams, page_size: int
) -> None:
    args = ServerArgs(model=model_path, page_size=page_size, num_kv_pages=64, device="cpu")
    engine = Engine(args)
    got, prefilled, finishes = run_n(engine, sampling)
    assert prefilled == len(PROMPT), "the n sequences must share one prefill"
    assert sorted(got) == list(range(sampling.n))
    assert finishes == dict.fromkeys(range(sampling.n), "length")
    solo = Engine(args)
    for j in range(sampling.n):
        alone = solo.generate([PROMPT], sampling.for_sequence(j))[0]
        assert got[j] == alone, f"sequence {j}"
    if sampling.temperature > 0:
        assert len({tuple(t) for t in got.values()}) > 1, "seeded streams must differ"
    assert engine.core.scheduler.pool.num_used_pages == 0  # every sequence freed its pages
    assert engine.runner.parked == {}


def test_a_sequence_that_ends_at_its_first_token_frees_its_kv_copy(model_path: str) -> None:
    args = ServerArgs(model=model_path, page_size=4, num_kv_pages=64, device="cpu")
    engine = Engine(args)
    got, _, finishes = run_n(engine, SamplingParams(max_tokens=1, temperature=1.0, seed=1, n=3))
    assert {j: len(t) for j, t in got.items()} == {0: 1, 1: 1, 2: 1}
    assert set(finishes.values()) == {"length"}
    assert engine.runner.parked == {} and engine.core.scheduler.queues.requests == {}


def test_sequence_seeds_are_distinct_and_sequence_0_keeps_the_request_s() -> None:
    sampling = SamplingParams(temperature=1.0, seed=5, n=4)
    seeds = [sampling.for_sequence(j).seed for j in range(4)]
    assert seeds[0] == 5 and len(set(seeds)) == 4
    assert all(sampling.for_sequence(j).n == 1 for j in range(4))
    assert SamplingParams(n=3).for_sequence(2).seed is None
