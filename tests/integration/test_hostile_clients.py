"""Nothing one client sends stops the DP group: one table of attacks, each beside ordinary load.

For every row: the attacker gets its 4xx (or its answer), the plain greedy completions sent at
the same time answer 200 with the text they have without any attack (a divergence is allowed
only at a near-tie, top-2 logprob gap < 1e-4: batch size changes the summation order), no rank
process restarts, and each rank's KV pool passes its integrity check once the group is idle.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from helpers import COMPLETIONS, MIB, wait_until

PLAIN = [
    {"prompt": [20 + i, 30, 40, 50], "max_tokens": 16, "temperature": 0, "logprobs": 2}
    for i in range(4)
]
NEAR_TIE = 1e-4


def post(url: str, body: dict[str, Any] | bytes, **kw: Any) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(f"{url}{COMPLETIONS}", content=body, timeout=300, **kw)
    return httpx.post(f"{url}{COMPLETIONS}", json=body, timeout=300, **kw)


def greedy(url: str) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(len(PLAIN)) as pool:
        responses = list(pool.map(lambda b: post(url, b), PLAIN))
    for r in responses:
        assert r.status_code == 200, r.text[:300]
    return [r.json()["choices"][0] for r in responses]


def same_or_near_tie(base: dict[str, Any], got: dict[str, Any]) -> bool:
    ours, theirs = base["logprobs"]["tokens"], got["logprobs"]["tokens"]
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            top = sorted(base["logprobs"]["top_logprobs"][i].values(), reverse=True)
            return len(top) > 1 and top[0] - top[1] < NEAR_TIE
    return True


# ---- the attacks: each runs against the URL and checks what the attacker got --------------


def duplicate_ids(url: str) -> None:
    headers = {"x-request-id": "same-for-all"}
    body = {"prompt": "dup", "max_tokens": 8}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: post(url, body, headers=headers), range(4)))
    assert [r.status_code for r in answers] == [200] * 4


def grammar_over_limits(url: str) -> None:
    props = {f"p{i}": {"type": "string"} for i in range(1000)}
    r = post(url, {"prompt": "x", "guided_json": {"type": "object", "properties": props}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "grammar_too_large"


def n_times_max_tokens_at_the_limit(url: str) -> None:
    r = post(url, {"prompt": "many", "n": 64, "max_tokens": 8, "ignore_eos": True})
    assert r.status_code == 200 and len(r.json()["choices"]) == 64


def prompts_256_in_one_request(url: str) -> None:
    r = post(url, {"prompt": [[7 + i % 50, 8] for i in range(256)], "max_tokens": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 256


def disconnect_mid_stream_100_times(url: str) -> None:
    body = {"prompt": "go", "max_tokens": 500, "ignore_eos": True, "stream": True}
    for _ in range(100):
        with httpx.stream("POST", f"{url}{COMPLETIONS}", json=body, timeout=60) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # the first event, then the client goes away


def slowloris_reader(url: str) -> None:
    body = {"prompt": "slow", "max_tokens": 64, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}{COMPLETIONS}", json=body, timeout=120) as r:
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_raw(16)):
            time.sleep(0.05)  # reads 16 bytes at a time, slowly, while the others run
            if i > 40:
                break


def invalid_utf8(url: str) -> None:
    r = post(url, b'{"prompt": "caf\xe9 \xff\xfe"}', headers={"content-type": "application/json"})
    assert r.status_code == 400


def logit_bias_10_mb(url: str) -> None:
    bias = json.dumps({str(i): 1 for i in range(800_000)})  # ~10 MB of JSON
    raw = b'{"prompt": "x", "logit_bias": ' + bias.encode() + b"}"
    assert len(raw) > 9 * MIB
    r = post(url, raw, headers={"content-type": "application/json"})
    assert r.status_code == 413


def mismatched_dp_rank_pins(url: str) -> None:
    for pin in (2, 99, -1):
        r = post(url, {"prompt": "pin", "max_tokens": 2, "dp_rank": pin})
        assert r.status_code == 400, (pin, r.text[:200])


ATTACKS: dict[str, Callable[[str], None]] = {
    "duplicate X-Request-Id": duplicate_ids,
    "grammar over the limits": grammar_over_limits,
    "n x max_tokens at the limit": n_times_max_tokens_at_the_limit,
    "256 prompts in one request": prompts_256_in_one_request,
    "disconnect mid stream x100": disconnect_mid_stream_100_times,
    "slowloris stream reader": slowloris_reader,
    "invalid UTF-8": invalid_utf8,
    "10 MB logit_bias": logit_bias_10_mb,
    "mismatched dp_rank pins": mismatched_dp_rank_pins,
}


@pytest.fixture(scope="module")
def baseline(app) -> list[dict[str, Any]]:
    return greedy(app.url)


def rank_pids(app) -> list[int]:
    return [app.rank_call("stats_snapshot", r)["pid"] for r in (0, 1)]


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_an_attack_beside_ordinary_load(app, baseline, attack: str) -> None:
    pids = rank_pids(app)
    failure: list[BaseException] = []

    def attacker() -> None:
        try:
            ATTACKS[attack](app.url)
        except BaseException as exc:  # reported below, after the plain load is checked
            failure.append(exc)

    thread = threading.Thread(target=attacker)
    thread.start()
    answers = greedy(app.url)
    thread.join(300)
    assert not thread.is_alive(), "the attack never ended"
    if failure:
        raise failure[0]
    for base, got in zip(baseline, answers, strict=True):
        assert same_or_near_tie(base, got), (base["text"], got["text"])
    assert rank_pids(app) == pids

    def idle() -> bool:
        snaps = [app.rank_call("stats_snapshot", r) for r in (0, 1)]
        return all(s["running"] == s["waiting"] == 0 for s in snaps)

    wait_until(idle, timeout_s=60)
    assert all(app.rank_call("check_pool", r) for r in (0, 1))
