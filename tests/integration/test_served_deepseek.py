"""The live dp=2 deployment serving a tiny random DeepSeek-V3 directory (MLA with a latent
cache, grouped sigmoid routing, experts split over the two ranks): greedy tokens over HTTP,
pinned to each rank, equal the offline Engine's on the same directory. The directory carries
a next-n (MTP) layer, unused until the last test redeploys with ``speculative_config`` method
``mtp``: the same answers, with one rank drafting while the other idles (the next-n layer's
MoE is a collective of both ranks: a rank that skipped its draft pass would hang the other)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import complete, stream_tokens
from mtp_models import save_deepseek_with_next_n
from test_served_speculative import spec_counters

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.server_args import ServerArgs

PROMPTS = [[5, 7, 9], list(range(20, 37)), [250, 11, 42, 42, 7, 8]]
TOKENS = 12


def save_word_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer (``t0`` .. ``t{n-1}``) so the ingress can decode any id."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="t0").save_pretrained(path)


@pytest.fixture(scope="module")
def deepseek(app: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """The shared deployment serving the directory; whatever it served before (the tiny preset,
    or the default model a ``real_model`` module asked for) comes back after."""
    before = dict(app.overrides)
    path = tmp_path_factory.mktemp("deepseek-v3-served")
    model = save_deepseek_with_next_n(path)["main"]
    save_word_tokenizer(path, model.config.vocab_size)
    app.deploy(model=str(path))
    yield app, str(path)
    app.deploy(**before)


@pytest.fixture(scope="module")
def offline(deepseek: tuple[Any, str]) -> list[list[int]]:
    args = ServerArgs(model=deepseek[1], page_size=4, num_kv_pages=256, max_scheduled_tokens=7)
    return Engine(args).generate(PROMPTS, SamplingParams(max_tokens=TOKENS))


@pytest.mark.parametrize("rank", [0, 1])
def test_http_greedy_on_each_rank_equals_the_offline_engine(
    deepseek: tuple[Any, str], offline: list[list[int]], rank: int
) -> None:
    app, _ = deepseek
    for prompt, expected in zip(PROMPTS, offline, strict=True):
        body = complete(
            app.url,
            prompt=prompt,
            max_tokens=TOKENS,
            temperature=0,
            ignore_eos=True,
            return_token_ids=True,
            dp_rank=rank,
        )
        assert body["choices"][0]["token_ids"] == expected, (rank, prompt)


def test_both_ranks_at_once_equal_the_offline_engine(
    deepseek: tuple[Any, str], offline: list[list[int]]
) -> None:
    """Requests on both ranks in the same rounds: the experts' all-to-all carries both."""
    from concurrent.futures import ThreadPoolExecutor

    app, _ = deepseek
    jobs = [(rank, i) for rank in (0, 1) for i in range(len(PROMPTS))]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda j: stream_tokens(app.ranks, j[0], PROMPTS[j[1]], TOKENS), jobs))
    assert outs == [offline[i] for _, i in jobs]


def test_mtp_drafts_keep_answers_and_lockstep(
    deepseek: tuple[Any, str], offline: list[list[int]]
) -> None:
    """Rank 0 drafts with the next-n layer for every prompt at once, then rank 1 serves one
    alone: each rank's rounds, busy or idle, run the same forwards, and every answer equals
    the offline Engine's without drafts."""
    from concurrent.futures import ThreadPoolExecutor

    app, _ = deepseek
    app.deploy(
        **{**app.overrides, "speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}
    )

    def on(rank: int, i: int) -> list[int]:
        body = complete(
            app.url,
            prompt=PROMPTS[i],
            max_tokens=TOKENS,
            temperature=0,
            ignore_eos=True,
            return_token_ids=True,
            dp_rank=rank,
        )
        return body["choices"][0]["token_ids"]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        assert list(pool.map(lambda i: on(0, i), range(len(PROMPTS)))) == offline
    assert on(1, 1) == offline[1]
    counters = spec_counters(app.url, until="roundgate_spec_decode_verifies_total")
    assert counters.get("roundgate_spec_decode_verifies_total", 0) > 0, counters
