"""deployment/configs/pd.yaml as shipped (one prefill and one decode rank of the real default
model) answers exactly as the fused deployment (local.yaml) does: greedy chat and completions,
streamed and not, a seeded ``n = 2`` with logprobs, prompts across several KV pages, several
requests at once. Afterwards both roles' pools are intact and hold no page, and the transfer
metrics count what moved."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.integration.helpers import sse_events
from tests.integration.pd_deploy import URL, deploy_pd, pools_settled

MODEL = "smollm2-135m-instruct"
LONG = (
    "Write a short note for a friend who is moving to a new city next month. Mention the "
    "weather, the food, the public transport, and one museum worth a visit on a rainy day."
)
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("completions", {"prompt": "The capital of France is"}),
    "completion-long": ("completions", {"prompt": LONG}),
    "chat": ("chat/completions", {"messages": CHAT}),
    "chat-long": ("chat/completions", {"messages": [{"role": "user", "content": LONG}]}),
}
GREEDY = {"max_tokens": 24, "temperature": 0, "return_token_ids": True}
SEEDED = {"max_tokens": 12, "temperature": 0.8, "seed": 7, "n": 2, "logprobs": 2}


def answer(url: str, endpoint: str, body: dict[str, Any], stream: bool) -> list[dict[str, Any]]:
    """Each choice's text, token ids and finish reason (a stream's deltas joined)."""
    with httpx.Client(timeout=300) as client:
        if not stream:
            r = client.post(f"{url}/v1/{endpoint}", json=body)
            assert r.status_code == 200, r.text
            return [_choice(c) for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
        joined: dict[int, dict[str, Any]] = {}
        with client.stream("POST", f"{url}/v1/{endpoint}", json={**body, "stream": True}) as r:
            assert r.status_code == 200, r.read()
            for event in sse_events(r):
                if event == "[DONE]":
                    break
                for c in event["choices"]:
                    out = joined.setdefault(c["index"], {"text": "", "ids": [], "finish": None})
                    out["text"] += c.get("text") or (c.get("delta") or {}).get("content") or ""
                    out["ids"] += c.get("token_ids") or []
                    out["finish"] = c.get("finish_reason") or out["finish"]
        return [joined[i] for i in sorted(joined)]


def _choice(c: dict[str, Any]) -> dict[str, Any]:
    text = c["text"] if "text" in c else c["message"]["content"]
    return {"text": text, "ids": c.get("token_ids") or [], "finish": c["finish_reason"]}


def run_all(url: str) -> dict[tuple[str, bool], list[dict[str, Any]]]:
    """Every greedy case, streamed and not, one at a time."""
    return {
        (name, stream): answer(url, endpoint, {**body, **GREEDY}, stream)
        for name, (endpoint, body) in CASES.items()
        for stream in (False, True)
    }


def seeded(url: str) -> list[dict[str, Any]]:
    """A seeded ``n = 2`` with logprobs (its first sequence ends at its first token: EOS)."""
    r = httpx.post(f"{url}/v1/completions", json={"prompt": LONG, **SEEDED}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"]


@pytest.fixture(scope="module")
def fused(real_model: Any) -> dict[tuple[str, bool], list[dict[str, Any]]]:
    """The fused deployment's answers (local.yaml with its own model: conftest's real_model)."""
    return {**run_all(real_model.url), ("seeded", False): seeded(real_model.url)}


@pytest.fixture(scope="module")
def pd(app: Any, fused: dict[Any, Any]) -> Iterator[str]:
    """pd.yaml as shipped in place of the shared deployment; what it served comes back after."""
    before = dict(app.overrides)
    deploy_pd()
    yield URL
    app.deploy(**before)


def test_pd_answers_equal_the_fused_deployment(
    pd: str, fused: dict[tuple[str, bool], list[dict[str, Any]]]
) -> None:
    ours = run_all(pd)
    for key, expected in ours.items():
        assert expected == fused[key], key
        assert expected[0]["ids"] and expected[0]["finish"] in ("length", "stop"), key


def test_concurrent_requests_equal_their_fused_answers(
    pd: str, fused: dict[tuple[str, bool], list[dict[str, Any]]]
) -> None:
    jobs = [(name, stream) for name in CASES for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(
            pool.map(
                lambda job: answer(pd, CASES[job[0]][0], {**CASES[job[0]][1], **GREEDY}, job[1]),
                jobs,
            )
        )
    for job, out in zip(jobs, outs, strict=True):
        assert out == fused[job], job


def test_pools_settle_empty_and_the_transfer_metrics_count_what_moved(pd: str) -> None:
    pools_settled()
    text = httpx.get(f"{pd}/metrics", timeout=30).text
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


def test_seeded_n2_with_logprobs_equals_the_fused_deployment(
    pd: str, fused: dict[tuple[str, bool], list[dict[str, Any]]]
) -> None:
    """Last in the module: the forks' first tokens come with the handoff, the seed's position
    carries over; sequence 0 ends at its first token here, so the forks' copy of the prompt's
    last page must outlive it."""
    for mine, theirs in zip(seeded(pd), fused[("seeded", False)], strict=True):
        assert mine["text"] == theirs["text"]
        got, want = mine["logprobs"], theirs["logprobs"]
        assert got["tokens"] == want["tokens"]
        assert got["token_logprobs"] == pytest.approx(want["token_logprobs"], abs=1e-3)
    pools_settled()
