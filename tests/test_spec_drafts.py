"""n-gram drafts (prompt lookup) and speculative_config's fields, each refusal named."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roundgate.actors.control.ngram_drafts import propose_ngram
from roundgate.actors.control.speculative_config import (
    SpeculativeConfig,
    parse_speculative_config,
)


@pytest.mark.parametrize(
    ("tokens", "min_n", "max_n", "k", "drafts", "why"),
    [
        ([1, 2, 3, 4, 9, 1, 2, 3], 1, 3, 2, (4, 9), "the 3-gram 1 2 3 occurred: what followed"),
        ([1, 2, 3, 4, 9, 1, 2, 3], 1, 3, 9, (4, 9, 1, 2, 3), "k caps the draft, history ends it"),
        ([5, 7, 1, 5, 8, 1, 5], 1, 2, 1, (8,), "of two 2-gram matches, the most recent"),
        ([5, 7, 2, 5, 8, 1, 5], 2, 2, 1, (), "no earlier 2-gram 1 5: nothing"),
        ([5, 7, 2, 5, 8, 1, 5], 1, 2, 1, (8,), "falls back to the 1-gram 5, most recent"),
        ([3, 3, 3], 1, 5, 2, (3,), "a run: the overlapping match just before the suffix"),
        ([4], 1, 3, 2, (), "one token has no earlier occurrence"),
        ([], 1, 3, 2, (), "empty history"),
        ([1, 2, 1, 2], 2, 2, 3, (1, 2), "the suffix itself is never its own match"),
    ],
)
def test_prompt_lookup(tokens, min_n, max_n, k, drafts, why) -> None:
    assert propose_ngram(tokens, min_n, max_n, k) == drafts, why


def test_a_copy_heavy_history_drafts_what_follows_in_the_source() -> None:
    source = list(range(100, 160))
    # The answer so far copied the first 20 tokens of the source: the drafts continue it.
    history = [*source, 7, 8, *source[:20]]
    assert propose_ngram(history, 2, 5, 4) == tuple(source[20:24])


@pytest.mark.parametrize(("min_n", "max_n", "k"), [(0, 2, 1), (3, 2, 1), (1, 2, 0)])
def test_bad_bounds_are_refused(min_n: int, max_n: int, k: int) -> None:
    with pytest.raises(ValueError, match=r"prompt_lookup|num_speculative_tokens"):
        propose_ngram([1, 2], min_n, max_n, k)


def test_vllm_shaped_configs_parse_with_vllms_defaults() -> None:
    ngram = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3})
    assert ngram == SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_min=5, prompt_lookup_max=5
    )
    only_max = parse_speculative_config(
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}
    )
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max, only_max.k) == (4, 4, 2)
    assert parse_speculative_config({"method": "mtp", "num_speculative_tokens": 1}).k == 1
    draft = parse_speculative_config(
        {"method": "draft_model", "model": "/m", "num_speculative_tokens": 4}
    )
    assert draft.model == "/m"


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("ngram", "must be a JSON object"),
        ({"method": "eagle9", "num_speculative_tokens": 1}, "method"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 17}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "speed": 1}, "speed"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 6,
             "prompt_lookup_max": 3},
            "prompt_lookup_min",
        ),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0}, "_max"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "/m"}, "model"),
        ({"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_min": 2}, "lookup_min"),
        ({"method": "mtp", "num_speculative_tokens": 1, "model": "/m"}, "model"),
        ({"method": "draft_model", "num_speculative_tokens": 1}, "model"),
    ],
)  # fmt: skip
def test_each_refusal_names_the_field(value: Any, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_speculative_config(value)


def test_a_request_whose_drafts_miss_pauses_its_drafts_longer_each_time() -> None:
    from roundgate.actors.control.request import Request, SamplingParams
    from roundgate.actors.control.speculation import MAX_PAUSE_ROUNDS, Speculator

    config = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 2})
    speculator = Speculator(replace_lookup(config), max_model_len=None)
    req = Request("r", [4, 5, 4, 5, 4, 5, 4], SamplingParams(max_tokens=500))

    def drafting_rounds(rounds: int) -> list[bool]:
        return [bool(speculator.drafts_for(req, 8)) for _ in range(rounds)]

    assert drafting_rounds(1) == [True]
    pauses = []
    for _ in range(9):  # misses in a row: 1, 2, 4 ... rounds without drafts, capped
        speculator.verified(req, 2, 0)
        rounds = drafting_rounds(MAX_PAUSE_ROUNDS + 1)
        pauses.append(rounds.index(True))
    assert pauses == [1, 2, 4, 8, 16, 32, 64, 64, 64]
    speculator.verified(req, 2, 1)  # a kept draft: every round again, and the next miss is 1
    assert drafting_rounds(3) == [True] * 3
    speculator.verified(req, 2, 0)
    assert drafting_rounds(2) == [False, True]
    assert speculator.stats.verifies == 11 and speculator.stats.accepted == 1


def replace_lookup(config: SpeculativeConfig) -> SpeculativeConfig:
    """The config with a 1..2 lookup (the test's short history)."""
    from dataclasses import replace

    return replace(config, prompt_lookup_min=1, prompt_lookup_max=2)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    history=st.lists(st.integers(0, 3), min_size=0, max_size=40),
    cut=st.integers(0, 40),
    bounds=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    k=st.integers(1, 6),
)
def test_the_index_proposes_what_the_scan_proposes(history, cut, bounds, k) -> None:
    """Grown in two steps (as a request's history grows between rounds), the index's drafts
    equal the reference scan's after each step."""
    from roundgate.actors.control.ngram_drafts import NgramIndex

    min_n, extra = bounds
    max_n = min_n + extra
    index = NgramIndex(min_n, max_n)
    cut = min(cut, len(history))
    index.extend(history[:cut])
    assert index.propose(k) == propose_ngram(history[:cut], min_n, max_n, k)
    index.extend(history[cut:])
    assert index.propose(k) == propose_ngram(history, min_n, max_n, k)


def test_a_request_drafts_at_most_one_more_than_it_last_kept() -> None:
    from roundgate.actors.control.request import Request, SamplingParams
    from roundgate.actors.control.speculation import Speculator

    config = parse_speculative_config(
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}
    )
    speculator = Speculator(config, max_model_len=None)
    req = Request("r", [4, 5, 6, 7, 8, 9] * 3 + [4], SamplingParams(max_tokens=500))
    assert len(speculator.drafts_for(req, 8)) == 4  # k to start with
    speculator.verified(req, 4, 1)  # one kept: two next time
    assert len(speculator.drafts_for(req, 8)) == 2
    speculator.verified(req, 2, 2)  # all kept: one more
    assert len(speculator.drafts_for(req, 8)) == 3
    speculator.verified(req, 3, 3)
    speculator.verified(req, 4, 4)  # never past k
    assert len(speculator.drafts_for(req, 8)) == 4
    assert len(speculator.drafts_for(req, 1)) == 1  # the round's room still caps it
