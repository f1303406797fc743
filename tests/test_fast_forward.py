"""The simulator's fast path (steady decode rounds in one step) changes no result: whole runs
with it and without it give the same summary, ITL samples and records, bit for bit."""

from __future__ import annotations

import json

import pytest
from sim_builders import make_spec, sim_args

from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import Router
from roundgate.sim.simulator import GroupSimulator
from roundgate.sim.workload import generate

CASES = [
    pytest.param("roundgate", {}, "h100-dsv3", None, id="gate"),
    pytest.param("none", {}, "h100-dsv3", None, id="none"),
    pytest.param("local-interval", {}, "h100-dsv3", None, id="local"),
    pytest.param("roundgate", {"enable_mixed_prefill_decode": True}, "gb200-dsv3", None, id="kv"),
    pytest.param("roundgate", {}, "h100-dsv3", 6, id="closed-loop"),
    pytest.param("none", {"num_kv_pages": 24}, "toy", None, id="kv-pressure"),
    pytest.param("roundgate", {"num_kv_pages": 40}, "gb200-dsv3", None, id="gate-pressure"),
    pytest.param("local-interval", {"enable_mixed_prefill_decode": True}, "toy", 3, id="mixed"),
]
SPECS = {
    "poisson": make_spec(num_requests=50, rate=4.0, input_len=40, output_len=30),
    "bursty": make_spec(num_requests=48, arrival="bursty", rate=6.0, burst_size=6, output_len=40),
}


def run(
    policy: str, overrides: dict, costs: str, concurrency, fast: bool, spec="poisson", router=None
):
    sim = GroupSimulator(
        sim_args(policy, **overrides),
        PRESETS[costs],
        router or Router("round-robin", 4, seed=1),
        policy,
        keep_timeline=False,
        fast_forward=fast,
    )
    return sim.run(generate(SPECS[spec]), concurrency=concurrency)


@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize(("policy", "overrides", "costs", "concurrency"), CASES)
def test_fast_path_changes_nothing(policy, overrides, costs, concurrency, spec) -> None:
    skewed = spec == "bursty"
    routers = [
        Router("skewed", 4, [5, 1, 1, 1], seed=2) if skewed else Router("round-robin", 4)
        for _ in range(2)
    ]
    slow = run(policy, overrides, costs, concurrency, False, spec, routers[0])
    fast = run(policy, overrides, costs, concurrency, True, spec, routers[1])
    assert json.dumps(summarize(fast), sort_keys=True) == json.dumps(
        summarize(slow), sort_keys=True
    )
    assert list(fast.itl_ms) == list(slow.itl_ms)
    assert [vars(r) for r in fast.records] == [vars(r) for r in slow.records]
    assert (fast.rounds, fast.duration_s) == (slow.rounds, slow.duration_s)


def pool_state(sim: GroupSimulator) -> list:
    """Every rank's pool as the rounds left it: keys by page, free and evictable order,
    evictions, and each request's page table."""
    state = []
    for loop in sim.loops:
        pool = loop.scheduler.pool
        owned = {owner: list(pages) for owner, pages in pool._owned.items()}
        state.append(
            (dict(pool._key_of), list(pool._free), list(pool._evictable), pool.num_evictions, owned)
        )
    return state


@pytest.mark.parametrize(
    ("concurrency", "num_kv_pages"), [(None, 256), (4, 256), (None, 60), (4, 60)]
)
def test_fast_path_keys_and_takes_the_same_pages(concurrency, num_kv_pages) -> None:
    """Decodes that complete a page key it (later turns may reuse it) and take the next one:
    the skipped rounds do both in the full rounds' order, so every pool ends in the same
    state, page ids and evictions included (60 pages: the cache evicts), with the same
    results."""
    pools, summaries = [], []
    for fast in (False, True):
        sim = GroupSimulator(
            sim_args(
                "roundgate", page_size=4, enable_prefix_caching=True, num_kv_pages=num_kv_pages
            ),
            PRESETS["h100-dsv3"],
            Router("round-robin", 4),
            "roundgate",
            keep_timeline=False,
            fast_forward=fast,
        )
        result = sim.run(generate(SPECS["poisson"]), concurrency=concurrency)
        summaries.append(json.dumps(summarize(result), sort_keys=True))
        pools.append(pool_state(sim))
    assert pools[0] == pools[1]
    assert summaries[0] == summaries[1]
    assert all(keys for keys, *_ in pools[0])
    assert (num_kv_pages == 60) == any(evictions for _, _, _, evictions, _ in pools[0])


def test_fast_path_engages_on_steady_decoding_and_finishes(monkeypatch) -> None:
    """The fast path skips rounds, and its last skipped round finishes requests."""
    calls, finished = [], []
    from roundgate.sim import fast_forward

    advance = fast_forward.advance

    def spy(*args, **kwargs):
        done = advance(*args, **kwargs)
        calls.append(done[0])
        finished.extend(done[2])
        return done

    monkeypatch.setattr(fast_forward, "advance", spy)
    result = run("roundgate", {}, "h100-dsv3", None, fast=True)
    assert sum(calls) > 0
    assert finished and all(req.is_finished for req in finished)
    assert result.unfinished == 0


@pytest.mark.parametrize("policy", ["none", "roundgate"])
def test_fast_path_counts_a_full_batchs_held_prompts_as_the_full_rounds(policy) -> None:
    """Prompts that arrive while the batch is full wait excused rounds: the first want's stamp
    sees round 0's excused count, as the full round's plan counts it before its probe."""
    spec = make_spec(num_requests=50, rate=30.0, input_len=10, output_len=30, seed=982)
    results = []
    for fast in (False, True):
        sim = GroupSimulator(
            sim_args(policy, dp_size=1, max_scheduled_tokens=64, enable_mixed_prefill_decode=True),
            PRESETS["gb200-dsv3"],
            Router("round-robin", 1),
            policy,
            keep_timeline=False,
            fast_forward=fast,
        )
        result = sim.run(generate(spec))
        results.append([vars(r) for r in result.records])
    assert results[0] == results[1]
    assert any(r["admission_wait"] for r in results[0])
