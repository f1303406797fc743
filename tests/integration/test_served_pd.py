"""deployment/configs/pd.yaml as shipped (one prefill and one decode rank of the real default
model) answers exactly as the fused deployment (local.yaml) does: greedy chat and completions,
streamed and not, a seeded ``n = 2`` with logprobs, prompts across several KV pages, several
requests at once. Afterwards both roles' pools are intact and hold no page, and the transfer
metrics count what moved. The deployment and the fused answers come from conftest's ``pd_app``
(``pd_deploy.py``), shared with the P/D fault module, which runs first."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.sessions import hit_rate, read_hit_counters, run_sessions
from sim.sessions import SessionSpec, make_sessions
from tests.integration.helpers import SMALL_CHAT_SESSIONS
from tests.integration.pd_deploy import (
    CASES,
    GREEDY,
    PDApp,
    answer,
    pd_config,
    pools_settled,
    run_all,
    seeded,
)


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


def test_kv_aware_routes_both_roles_on_what_they_report(pd_app: PDApp) -> None:
    """Last in the session (it replaces pd.yaml): ``router: kv-aware`` under P/D, on the tiny
    preset for time. Both roles publish to the KV-event hub: the prefill rank its page keys
    (the prefill router's index), the decode rank its load with the handoffs it received (the
    decode router's in-flight sends settle on that count). Multi-turn sessions complete and
    reuse the prefill rank's cached prefixes."""
    import ray

    from actors.control.kv_events import HUB_NAME, HUB_NAMESPACE
    from deployment.local import deploy, wait_ready

    port = int(pd_app.url.rsplit(":", 1)[1])
    deploy(pd_config(port, model="tiny-moe", router="kv-aware", enable_prefix_caching=True))
    wait_ready(pd_app.url)
    preset = SMALL_CHAT_SESSIONS
    sessions = make_sessions(SessionSpec(preset, num_sessions=4, rate=20.0, vocab_size=256))
    before = read_hit_counters(pd_app.url, settle=True)
    results, _ = asyncio.run(run_sessions(pd_app.url, "tiny-moe", sessions, timeout_s=300))
    assert len(results) == 4 * preset.turns and all(r.ok for r in results)
    rate = hit_rate(before, read_hit_counters(pd_app.url, settle=True))
    assert rate is not None and rate > 0.2
    pools_settled()
    hub = ray.get_actor(HUB_NAME, namespace=HUB_NAMESPACE)
    snapshots = {s.source: s for s in ray.get(hub.snapshots.remote(), timeout=30)}
    prefill = [s for src, s in snapshots.items() if "PrefillRank" in src]
    decode = [s for src, s in snapshots.items() if "DecodeRank" in src]
    assert len(prefill) == 1 and len(decode) == 1, list(snapshots)
    assert prefill[0].keys  # the prompts' pages, as the prefill rank reported them
    assert decode[0].load.num_received >= len(results)
