"""Offline prefill/decode disaggregation equals the fused engine, on real models.

A prefill rank and a decode rank (``roundgate.actors.disaggregated``) hand each request over with
its first token and its KV pages copied in the pools' own layout (MLA's latent pages for the
DeepSeek-V3 model); the decode rank's output must be the fused engine's token for token. The
round records say what each role ran: the decode rank only single-token decodes, the prefill
rank only prefill chunks. Both pools are checked for integrity and left empty.
"""

from __future__ import annotations

import json

import pytest
import torch
from family_models import build_family

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.disaggregated import DisaggregatedEngine
from roundgate.actors.engine import Engine
from roundgate.actors.pd_roles import check_pair
from roundgate.actors.server_args import ServerArgs

# Lengths around the 4-token page: partial last pages, page-aligned prompts, a one-token one.
PROMPTS = [[5, 7, 9], list(range(20, 37)), [3, 1, 4, 1, 5, 9, 2, 6], [250], list(range(40, 52))]


def pd_pair(model: str, **overrides: object) -> tuple[ServerArgs, ServerArgs, ServerArgs]:
    """(fused, prefill, decode) args for ``model``: same pages, same pool."""
    base = {"model": model, "page_size": 4, "num_kv_pages": 64, "device": "cpu"} | overrides
    return (
        ServerArgs(**base),
        ServerArgs(**base, disaggregation_mode="prefill"),
        ServerArgs(**base, disaggregation_mode="decode"),
    )


def fused_run(args: ServerArgs, requests: list[Request]) -> dict[str, Request]:
    """Every sequence's final request by id (forks included), on the fused engine."""
    engine = Engine(args)
    seen: dict[str, Request] = {}
    engine.core.on_event = lambda event: seen.__setitem__(event.request.request_id, event.request)
    engine.run(requests)
    return seen


def check_roles_ran_their_part(pd: DisaggregatedEngine) -> None:
    """The decode rank ran decodes only; the prefill rank never decoded; nothing leaked."""
    for plan in pd.records.decode_plans:
        assert all(c.num_tokens == 1 and not c.is_prefill for c in plan.chunks), plan.chunks
    for plan in pd.records.prefill_plans:
        assert all(c.is_prefill for c in plan.chunks), plan.chunks
    assert any(plan.chunks for plan in pd.records.decode_plans)
    for core in (pd.prefill, pd.decode):
        core.scheduler.pool.check_integrity()
        assert core.scheduler.pool.num_used_pages == 0
    assert not pd.prefill.scheduler.connector.pinned


def flat(logprobs: list) -> list[float]:
    """A sequence's logprobs as one list of floats (sampled token's, then the top k's)."""
    return [x for lp in logprobs for x in (lp.logprob, *lp.top_logprobs)]


def requests_of(prompts: list[list[int]], sampling: SamplingParams) -> list[Request]:
    return [Request(f"r{i}", list(p), sampling) for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def deepseek_v3(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("pd-dsv3")
    build_family("deepseek_v3").save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-moe", "deepseek_v3"])
def test_greedy_pd_output_equals_the_fused_engine(model: str, request: pytest.FixtureRequest):
    torch.set_num_threads(1)
    name = request.getfixturevalue(model) if model == "deepseek_v3" else model
    fused, prefill, decode = pd_pair(name)
    sampling = SamplingParams(max_tokens=7)
    want = fused_run(fused, requests_of(PROMPTS, sampling))
    pd = DisaggregatedEngine(prefill, decode)
    got = pd.run(requests_of(PROMPTS, sampling))
    assert {k: r.output_token_ids for k, r in got.items()} == {
        k: r.output_token_ids for k, r in want.items()
    }
    check_roles_ran_their_part(pd)
    # Every prompt page moved once (nothing was cached on the decode rank at reservation).
    assert pd.stats.num_pages == sum(-(-len(p) // 4) for p in PROMPTS)
    per_page = pd.decode_runner.cache.bytes_per_token * 4
    assert pd.stats.num_bytes == pd.stats.num_pages * per_page


def test_n_sequences_logprobs_and_prompt_logprobs_cross_over_with_the_handoff() -> None:
    """Seeded n > 1 forks on the decode rank over shared pages; first-token logprobs and
    prompt logprobs come with the handoff; every sequence equals the fused engine's."""
    torch.set_num_threads(1)
    fused, prefill, decode = pd_pair("tiny-llama")
    cases = [
        SamplingParams(max_tokens=6, temperature=1.0, seed=7, n=3, logprobs=2),
        SamplingParams(max_tokens=5, prompt_logprobs=1, logprobs=1),
        SamplingParams(max_tokens=5, temperature=0.9, seed=11, n=2),
    ]
    prompts = [list(range(20, 31)), [9, 8, 7, 6, 5, 4, 3, 2], list(range(60, 73))]

    def build() -> list[Request]:
        return [Request(f"r{i}", p, s) for i, (p, s) in enumerate(zip(prompts, cases, strict=True))]

    want = fused_run(fused, build())
    pd = DisaggregatedEngine(prefill, decode)
    got = pd.run(build())
    assert set(got) == set(want) == {"r0", "r0#1", "r0#2", "r1", "r2", "r2#1"}
    for rid, req in want.items():
        mine = got[rid]
        assert mine.output_token_ids == req.output_token_ids, rid
        assert (mine.index, mine.stream_id) == (req.index, req.stream_id)
        for kind in ("output_logprobs", "prompt_logprobs"):
            mine_lps, want_lps = getattr(mine, kind), getattr(req, kind)
            assert [lp.top_ids for lp in mine_lps] == [lp.top_ids for lp in want_lps]
            assert flat(mine_lps) == pytest.approx(flat(want_lps), abs=1e-4)
    assert len(got["r1"].prompt_logprobs) == len(prompts[1]) - 1
    check_roles_ran_their_part(pd)


def test_a_prefix_cached_decode_rank_receives_only_the_missing_pages() -> None:
    torch.set_num_threads(1)
    fused, prefill, decode = pd_pair("tiny-llama")
    shared = list(range(100, 112))  # three full pages
    prompts = [[*shared, 7], [*shared, 8, 9, 10, 11, 12]]
    sampling = SamplingParams(max_tokens=4)
    pd = DisaggregatedEngine(prefill, decode)
    first = pd.run(requests_of(prompts[:1], sampling))
    moved = pd.stats.num_pages
    assert moved == 4 and pd.stats.num_cached_pages == 0
    second = pd.run([Request("r1", prompts[1], sampling)])
    # The decode rank had the three shared pages: only the two others moved.
    assert pd.stats.num_pages - moved == 2 and pd.stats.num_cached_pages == 3
    want = fused_run(fused, requests_of(prompts, sampling))
    assert first["r0"].output_token_ids == want["r0"].output_token_ids
    assert second["r1"].output_token_ids == want["r1"].output_token_ids
    check_roles_ran_their_part(pd)


def test_a_failed_transfer_fails_that_request_alone_and_frees_its_pages() -> None:
    torch.set_num_threads(1)
    fused, prefill, decode = pd_pair("tiny-llama")
    sampling = SamplingParams(max_tokens=6)
    pd = DisaggregatedEngine(prefill, decode, fail_transfer=lambda r: r.request_id == "r1")
    got = pd.run(requests_of(PROMPTS, sampling))
    want = fused_run(fused, requests_of(PROMPTS, sampling))
    assert got["r1"].error == "KV transfer of request r1 failed"
    assert got["r1"].finish_reason == "error" and got["r1"].output_token_ids == []
    for rid in ("r0", "r2", "r3", "r4"):
        assert got[rid].output_token_ids == want[rid].output_token_ids
    assert pd.stats.num_failed == 1
    check_roles_ran_their_part(pd)


def test_a_grammar_request_replays_its_first_token_on_the_decode_rank() -> None:
    """The decode rank's fresh matcher is fed the first token, so the output still follows
    the grammar and equals the fused engine's (the default model, its tokenizer)."""
    torch.set_num_threads(1)
    model = "smollm2-135m-instruct"
    fused, prefill, decode = pd_pair(model, num_kv_pages=32, page_size=16)
    from roundgate.actors.model.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    prompt = tok.render_chat([{"role": "user", "content": "Is the sky blue?"}])
    choices = ["yes indeed", "no way", "maybe so"]
    sampling = SamplingParams(max_tokens=6, grammar=("choice", json.dumps(choices)))
    want = fused_run(fused, [Request("g", prompt, sampling)])
    got = DisaggregatedEngine(prefill, decode).run([Request("g", prompt, sampling)])
    assert got["g"].output_token_ids == want["g"].output_token_ids
    assert tok.decode(got["g"].output_token_ids).strip() in choices


@pytest.mark.parametrize(
    ("prefill", "decode", "culprit"),
    [
        ({"disaggregation_mode": "null"}, {}, "--disaggregation-mode prefill"),
        ({}, {"disaggregation_mode": "prefill"}, "--disaggregation-mode decode"),
        ({}, {"page_size": 8}, "--page-size"),
        ({}, {"model": "tiny-moe"}, "--model"),
    ],
)
def test_mismatched_roles_are_refused_naming_the_field(
    prefill: dict, decode: dict, culprit: str
) -> None:
    base = {"model": "tiny-llama", "page_size": 4, "num_kv_pages": 16, "device": "cpu"}
    with pytest.raises(ValueError, match=culprit):
        check_pair(
            ServerArgs(**({"disaggregation_mode": "prefill"} | base | prefill)),
            ServerArgs(**({"disaggregation_mode": "decode"} | base | decode)),
        )
