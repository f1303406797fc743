"""deployment/configs/pd.yaml as shipped (one prefill and one decode rank of the real default
model) answers exactly as the fused deployment (local.yaml) does: greedy chat and completions,
streamed and not, a seeded ``n = 2`` with logprobs, prompts across several KV pages, several
requests at once. Afterwards both roles' pools are intact and hold no page, and the transfer
metrics count what moved. The deployment and the fused answers come from conftest's ``pd_app``
(``pd_deploy.py``), shared with the P/D fault module, which runs first. Last, ``router:
kv-aware`` on two decode ranks must hand each request to the one with less to decode."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from helpers import BackgroundStream, complete, wait_for
from pd_deploy import (
    CASES,
    GREEDY,
    PDApp,
    answer,
    pd_config,
    pools_settled,
    role_call,
    run_all,
    seeded,
)

from roundgate.actors.control.page_keys import page_keys


def test_pd_answers_equal_the_fused_deployment(pd_app: PDApp) -> None:
    ours = run_all(pd_app.url)
    for key, expected in ours.items():
        assert expected == pd_app.fused[key], key
        assert expected[0]["ids"] and expected[0]["finish"] in ("length", "stop"), key


def test_concurrent_requests_equal_their_fused_answers(pd_app: PDApp) -> None:
    jobs = [(name, stream) for name in CASES for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(
            pool.map(
                lambda job: answer(
                    pd_app.url, CASES[job[0]][0], {**CASES[job[0]][1], **GREEDY}, job[1]
                ),
                jobs,
            )
        )
    for job, out in zip(jobs, outs, strict=True):
        assert out == pd_app.fused[job], job


def test_pools_settle_empty_and_the_transfer_metrics_count_what_moved(pd_app: PDApp) -> None:
    pools_settled()
    text = httpx.get(f"{pd_app.url}/metrics", timeout=30).text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[-1])
        for line in text.splitlines()
        if line.startswith("roundgate_kv_transfer_pages_total")
        or line.startswith("roundgate_request_kv_transfer_seconds_count")
    }
    by_role = {
        role: sum(v for k, v in samples.items() if f'role="{role}"' in k and "pages" in k)
        for role in ("prefill", "decode")
    }
    assert by_role["prefill"] > 0 and by_role["decode"] > 0
    assert any("request_kv_transfer_seconds_count" in k and v > 0 for k, v in samples.items())


def test_seeded_n2_with_logprobs_equals_the_fused_deployment(pd_app: PDApp) -> None:
    """The forks' first tokens come with the handoff, the seed's position
    carries over; sequence 0 ends at its first token here (EOS), so the forks' copy of the
    prompt's last page must outlive it."""
    for mine, theirs in zip(seeded(pd_app.url), pd_app.fused_seeded, strict=True):
        assert mine["text"] == theirs["text"]
        got, want = mine["logprobs"], theirs["logprobs"]
        assert got["tokens"] == want["tokens"]
        assert got["token_logprobs"] == pytest.approx(want["token_logprobs"], abs=1e-3)
    pools_settled()


PAGE_SIZE = 16  # pd.yaml's
NUM_SHORT = 4


def hub_snapshots() -> list[Any]:
    import ray

    from roundgate.actors.control.kv_events import HUB_NAME, HUB_NAMESPACE

    hub = ray.get_actor(HUB_NAME, namespace=HUB_NAMESPACE)
    return ray.get(hub.snapshots.remote(), timeout=30)


def decode_received() -> tuple[str | None, dict[str, int]]:
    """The decode rank running a request (None unless exactly one does), and each decode
    rank's handoffs received, as the ranks last reported them (a rank that never ran a round
    has not reported: it received none)."""
    loads = {s.source: s.load for s in hub_snapshots() if "DecodeRank" in s.source}
    running = [source for source, load in loads.items() if load.num_running > 0]
    busy = running[0] if len(running) == 1 else None
    return busy, {source: load.num_received for source, load in loads.items()}


def one_busy(seen: tuple[str | None, dict[str, int]]) -> bool:
    busy, received = seen
    return busy is not None and received[busy] >= 1


def test_kv_aware_hands_each_request_to_the_decode_rank_with_less_to_decode(
    pd_app: PDApp,
) -> None:
    """Last in the session (it replaces pd.yaml): ``router: kv-aware`` under P/D, on the tiny
    preset for time, with one prefill rank and two decode ranks, so the decode router has a
    wrong choice to make. A long stream holds one decode rank's pool; every short request
    after it must go to the other (the least decode load the ranks report: round-robin sends
    half of them, a first-candidate pick all, to the busy one). Both roles publish to the
    KV-event hub: the prefill rank its page keys, the decode ranks their load with the handoffs
    they received. The short prompts share two pages, which the prefill rank reuses."""
    import random

    from roundgate.deployment.local import deploy, wait_ready

    url = pd_app.url
    port = int(url.rsplit(":", 1)[1])
    two_decode_ranks = {"dp_size": 2}
    deploy(
        pd_config(
            port,
            model="tiny-moe",
            router="kv-aware",
            enable_prefix_caching=True,
            decode=two_decode_ranks,
        )
    )
    wait_ready(url)
    rng = random.Random(3921)
    shared = [rng.randrange(1, 256) for _ in range(2 * PAGE_SIZE)]
    prompts = [shared + [rng.randrange(1, 256) for _ in range(6)] for _ in range(NUM_SHORT)]
    stream = BackgroundStream(
        url,
        prompt=[rng.randrange(1, 256) for _ in range(4 * PAGE_SIZE)],
        max_tokens=4000,
        ignore_eos=True,
        temperature=0,
    )
    try:
        assert stream.started.wait(60)
        busy, before = wait_for(
            decode_received, 30, "the long stream's decode rank reporting it", until=one_busy
        )
        hits_before = role_call("prefill", "stats_snapshot")["prefix_hits"]
        for prompt in prompts:
            complete(url, prompt=prompt, max_tokens=4, ignore_eos=True, temperature=0)
        _, after = wait_for(
            decode_received,
            30,
            "the decode ranks reporting the short requests",
            until=lambda seen: sum(seen[1].values()) - sum(before.values()) >= NUM_SHORT,
        )
        hits = role_call("prefill", "stats_snapshot")["prefix_hits"] - hits_before
        assert not stream.done.is_set(), "the long stream ended before the short requests"
    finally:
        stream.close()
    assert after[busy] == before[busy], (busy, before, after)
    assert sum(after.values()) - sum(before.values()) == NUM_SHORT, (before, after)
    # Every short prompt after the first finds the shared pages on the one prefill rank.
    assert hits >= (NUM_SHORT - 1) * len(shared), hits
    pools_settled(num_decode_ranks=2)
    prefill = [s for s in hub_snapshots() if "PrefillRank" in s.source]
    assert len(prefill) == 1
    for prompt in prompts:  # the prompts' pages, as the prefill rank reported them
        assert set(page_keys(prompt, PAGE_SIZE)) <= prefill[0].keys
