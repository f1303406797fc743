"""The draft model of ``speculative_config.method = "draft_model"``: its refusals at load, its
logits against the project's decoder and transformers', and its greedy drafts — from scratch,
after a prefix it has cached, batched or one request at a time, with ``k`` per request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_driver import (
    drive,
    grow_pages,
    hf_greedy,
    make_requests,
    make_runner,
    save_tiny_hf_model,
)

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.round import RoundPlan, ScheduledChunk
from roundgate.actors.model.config import PRESETS, ModelConfig, with_overrides
from roundgate.actors.model.config_parts import MLAConfig
from roundgate.actors.model.draft_cache import DraftCache
from roundgate.actors.model.draft_checks import check_draft
from roundgate.actors.model.draft_model import DraftModel
from roundgate.actors.model.resolve import resolve_model_config

TINY = PRESETS["tiny-llama"]


def make_draft(model: str = "tiny-llama", target: ModelConfig | None = None, **kw) -> DraftModel:
    target = target or resolve_model_config(model)
    return DraftModel.load(model, target, dtype=torch.float32, device="cpu", **kw)


def tokens(n: int, seed: int, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, str]:
    path = tmp_path_factory.mktemp("llama")
    return save_tiny_hf_model("llama", path), str(path)


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "target", "message"),
    [
        ("tiny-llama", with_overrides(TINY, vocab_size=1024), "vocabulary has 512 tokens"),
        ("tiny-moe", TINY, "a MoE draft is not supported"),
        ("tiny-llama", with_overrides(TINY, num_layers=2), "more than the target's"),
        ("/no/such/draft", TINY, "cannot be read"),
    ],
)
def test_load_refuses_naming_the_field(model: str, target: ModelConfig, message: str) -> None:
    with pytest.raises(ValueError, match=f"speculative_config.model.*{message}"):
        make_draft(model, target)


def test_a_latent_attention_draft_is_refused() -> None:
    mla = MLAConfig(None, 16, 8, 8, 8)
    with pytest.raises(ValueError, match=r"speculative_config.model 'mla'.*latent-attention"):
        check_draft("mla", with_overrides(TINY, mla=mla), TINY)


def test_a_draft_as_large_as_its_target_is_taken() -> None:
    check_draft("tiny-llama", TINY, TINY)


def test_an_unloadable_checkpoint_is_refused(tmp_path: Path, llama_dir) -> None:
    _, path = llama_dir
    (tmp_path / "config.json").write_text((Path(path) / "config.json").read_text())
    target = resolve_model_config(path)
    with pytest.raises(ValueError, match=r"speculative_config.model .*cannot be loaded"):
        make_draft(str(tmp_path), target)  # a config.json without its weights


def write_tokenizer(directory: Path, vocab: dict[str, int]) -> str:
    directory.mkdir(exist_ok=True)
    body = {"model": {"type": "BPE", "vocab": vocab}, "added_tokens": []}
    (directory / "tokenizer.json").write_text(json.dumps(body))
    return str(directory)


def test_a_draft_of_another_tokenizer_is_refused(tmp_path: Path, llama_dir) -> None:
    _, path = llama_dir
    draft = tmp_path / "draft"
    draft.mkdir()
    for file in Path(path).iterdir():
        (draft / file.name).write_bytes(file.read_bytes())
    write_tokenizer(draft, {"a": 0, "b": 1, "c": 2})
    same = write_tokenizer(tmp_path / "same", {"a": 0, "b": 1, "c": 2, "d": 3})
    other = write_tokenizer(tmp_path / "other", {"a": 0, "c": 1, "b": 2})
    target = resolve_model_config(path)
    make_draft(str(draft), target, target_model=same)  # a longer list: the shared ids agree
    with pytest.raises(ValueError, match=r"speculative_config.model .*token 1 is 'b'.*'c'"):
        make_draft(str(draft), target, target_model=other)


# -- logits -------------------------------------------------------------------------------------


def test_logits_equal_the_projects_decoder() -> None:
    prompt = tokens(37, seed=1)
    runner, pool = make_runner("tiny-llama"), KVPool(PoolConfig(64, 4))
    (request,) = make_requests([prompt])
    grow_pages(pool, request, len(prompt))
    chunk = ScheduledChunk(request, 0, len(prompt), True)
    # The runner gives the last position first, then the extra rows.
    ours = runner.forward(RoundPlan(chunks=[chunk]), extra_rows=list(range(len(prompt) - 1)))
    theirs = make_draft().logits(prompt)
    torch.testing.assert_close(theirs, torch.cat([ours[1:], ours[:1]]))


def test_logits_equal_transformers_llama(llama_dir) -> None:
    model, path = llama_dir
    prompt = tokens(40, seed=2, vocab=300)
    with torch.no_grad():
        expected = model(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(make_draft(path).logits(prompt), expected, rtol=1e-4, atol=1e-4)


# -- drafts -------------------------------------------------------------------------------------


def test_a_model_drafts_its_own_greedy_continuation(llama_dir) -> None:
    model, path = llama_dir
    prompt = tokens(12, seed=3, vocab=300)
    assert make_draft(path).propose({"r": prompt}, {"r": 8}) == {
        "r": tuple(hf_greedy(model, prompt, 8))
    }


def test_a_preset_drafts_the_runners_greedy_tokens() -> None:
    prompts = [tokens(9, seed=4), tokens(21, seed=5)]
    runner, pool = make_runner("tiny-llama"), KVPool(PoolConfig(64, 4))
    greedy = drive(runner, pool, make_requests(prompts, max_tokens=6))
    drafts = make_draft().propose({"a": prompts[0], "b": prompts[1]}, {"a": 6, "b": 6})
    assert [list(drafts["a"]), list(drafts["b"])] == greedy


def kept_then(kept: int):
    """The next history after a verification that kept ``kept`` of 4 drafts."""

    def build(history: list[int], drafts: tuple[int, ...]) -> list[int]:
        own = (drafts[kept] + 1) % 512 if kept < len(drafts) else 7
        return [*history, *drafts[:kept], own]

    return build


@pytest.mark.parametrize(
    ("following", "why"),
    [
        (kept_then(4), "every draft kept, then the verification's own token"),
        (kept_then(2), "two drafts kept, the third replaced"),
        (kept_then(0), "the first draft rejected"),
        (lambda h, d: [*h[:20], 99, *h[21:], 5], "a token changed mid-history"),
        (lambda h, d: h[:12], "a shorter history"),
    ],
)
def test_a_cached_prefix_drafts_as_from_scratch(following, why: str) -> None:
    draft, fresh = make_draft(), make_draft()
    history = tokens(30, seed=6)
    first = draft.propose({"r": history}, {"r": 4})["r"]
    assert draft.cache.tokens("r") == [*history, *first[:-1]]  # the last draft is never run
    nxt = following(history, first)
    assert draft.propose({"r": nxt}, {"r": 4}) == fresh.propose({"r": nxt}, {"r": 4}), why


def test_batched_drafts_equal_one_by_one() -> None:
    histories = {f"r{i}": tokens(5 + 9 * i, seed=10 + i) for i in range(4)}
    ks = {"r0": 4, "r1": 1, "r2": 3, "r3": 2}
    batched = make_draft()
    together = batched.propose(histories, ks)
    alone = {r: make_draft().propose({r: h}, {r: ks[r]})[r] for r, h in histories.items()}
    assert together == alone
    assert [len(together[r]) for r in histories] == [4, 1, 3, 2]
    # A second round: each request kept a different share of its drafts.
    grown = {r: [*h, *together[r][: i % 2 + 1], 11] for i, (r, h) in enumerate(histories.items())}
    assert batched.propose(grown, ks) == {
        r: make_draft().propose({r: h}, {r: ks[r]})[r] for r, h in grown.items()
    }


def test_requests_drafting_in_another_order_or_rounds_apart_keep_their_rows() -> None:
    histories = {f"r{i}": tokens(8 + 5 * i, seed=30 + i) for i in range(3)}
    draft = make_draft()
    draft.propose(histories, {r: 2 for r in histories})
    rounds = [
        ["r2", "r1", "r0"],  # the same requests, listed the other way round
        ["r2"],  # r2 takes row 0 from r0, which waits in a higher row
        ["r0", "r1"],  # r0 back in a low row, r2 waits
        ["r1", "r2", "r0"],
    ]
    for n, order in enumerate(rounds):
        for r in order:
            histories[r] = [*histories[r], 40 + n]
        call = {r: histories[r] for r in order}
        expected = {r: make_draft().propose({r: h}, {r: 3})[r] for r, h in call.items()}
        assert draft.propose(call, {r: 3 for r in order}) == expected, order


def test_a_long_history_is_caught_up_over_calls_under_a_prefill_budget() -> None:
    draft = make_draft(max_prefill_tokens=8)
    short, long = tokens(3, seed=40), tokens(30, seed=41)
    calls = [draft.propose({"s": short, "l": long}, {"s": 2, "l": 2}) for _ in range(5)]
    # s runs first (3 new tokens, then 1 a call); l gets what is left of 8: 5, then 7, 7,
    # 7, and its last 4 with its drafts on the fifth call.
    assert [len(c["l"]) for c in calls] == [0, 0, 0, 0, 2]
    assert all(len(c["s"]) == 2 for c in calls)
    assert calls[-1]["l"] == make_draft().propose({"l": long}, {"l": 2})["l"]
    assert calls[-1]["s"] == make_draft().propose({"s": short}, {"s": 2})["s"]


def test_k_zero_skips_the_request_and_keeps_its_row() -> None:
    draft = make_draft()
    a, b = tokens(10, seed=20), tokens(14, seed=21)
    draft.propose({"a": a, "b": b}, {"a": 2, "b": 2})
    held = draft.cache.tokens("b")
    out = draft.propose({"a": a, "b": [*b, 3]}, {"a": 2, "b": 0})
    assert out["b"] == () and len(out["a"]) == 2
    assert draft.cache.tokens("b") == held


def test_drafts_stop_at_the_drafts_context() -> None:
    draft = make_draft(max_len=20)
    out = draft.propose({"a": tokens(18, 1), "b": tokens(21, 2)}, {"a": 4, "b": 4})
    assert (len(out["a"]), out["b"]) == (3, ())  # positions 17, 18, 19 read; 21 > 20 tokens


@pytest.mark.parametrize(
    ("k", "message"),
    [({"a": 1}, "no k given for request 'b'"), ({"a": 1, "b": -1}, "k of request 'b' is -1")],
)
def test_a_missing_or_negative_k_is_refused(k: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_draft().propose({"a": [1, 2], "b": [3]}, k)


def test_release_forgets_the_request() -> None:
    draft = make_draft()
    draft.propose({"a": tokens(10, 1)}, {"a": 2})
    draft.release("a")
    assert draft.cache.tokens("a") == []


# -- the cache's rows ---------------------------------------------------------------------------


def make_cache(max_requests: int = 4) -> DraftCache:
    return DraftCache(
        1, 1, 2, max_requests=max_requests, max_len=64, dtype=torch.float32, device="cpu"
    )


def fill_row(cache: DraftCache, request_id: str, row: int, value: float, length: int = 3) -> None:
    cache.reserve(length)
    cache.k[0, row, :, :length] = value
    cache.set_tokens(request_id, list(range(length)))


def test_a_call_takes_the_low_rows_and_others_keep_their_kv() -> None:
    cache = make_cache()
    assert cache.place(["a", "b", "c"]) == [0, 1, 2]
    for request_id, row in zip("abc", range(3), strict=True):
        fill_row(cache, request_id, row, float(row + 1))
    assert cache.place(["c", "b", "a"]) == [2, 1, 0]  # nothing moves
    assert cache.place(["c"]) == [0]  # c swaps into row 0, a into c's old row
    assert cache.place(["b"]) == [0]  # b swaps into row 0, c into b's old row
    rows = dict(zip("abc", cache.place(["a", "b", "c"]), strict=True))  # a back to a low row
    assert {r: float(cache.k[0, row, 0, 0, 0]) for r, row in rows.items()} == {
        "a": 1.0,
        "b": 2.0,
        "c": 3.0,
    }
    assert cache.tokens("b") == [0, 1, 2]


@pytest.mark.parametrize(
    ("calls", "evicted"),
    [
        ([["a", "b"], ["c"], ["d", "e"]], ["a", "b"]),  # the two used longest ago
        ([["a", "b"], ["c"], ["a"], ["d", "e"]], ["b", "c"]),
    ],
)
def test_the_least_recently_used_requests_are_evicted(calls: list[list[str]], evicted) -> None:
    cache = make_cache(max_requests=3)
    for call in calls:
        for request_id, row in zip(call, cache.place(call), strict=True):
            fill_row(cache, request_id, row, 1.0)
    assert sorted(r for r in "abcde" if not cache.tokens(r)) == evicted
    assert cache.num_rows == 3


def test_more_requests_than_the_cache_holds_are_refused() -> None:
    with pytest.raises(ValueError, match="exceed its cache of 2"):
        make_cache(max_requests=2).place(["a", "b", "c"])
