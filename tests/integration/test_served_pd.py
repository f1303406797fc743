"""deployment/configs/pd.yaml as shipped (one prefill and one decode rank of the real default
model) answers exactly as the fused deployment (local.yaml) does: greedy chat and completions,
streamed and not, a seeded ``n = 2`` with logprobs, prompts across several KV pages, several
requests at once. Afterwards both roles' pools are intact and hold no page, and the transfer
metrics count what moved. The deployment and the fused answers come from conftest's ``pd_app``
(``pd_deploy.py``), shared with the P/D fault module, which runs first."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.integration.pd_deploy import CASES, GREEDY, PDApp, answer, pools_settled, run_all, seeded


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
    """Last in the module: the forks' first tokens come with the handoff, the seed's position
    carries over; sequence 0 ends at its first token here (EOS), so the forks' copy of the
    prompt's last page must outlive it."""
    for mine, theirs in zip(seeded(pd_app.url), pd_app.fused_seeded, strict=True):
        assert mine["text"] == theirs["text"]
        got, want = mine["logprobs"], theirs["logprobs"]
        assert got["tokens"] == want["tokens"]
        assert got["token_logprobs"] == pytest.approx(want["token_logprobs"], abs=1e-3)
    pools_settled()
