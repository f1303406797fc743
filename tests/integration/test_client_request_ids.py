"""A client's ``X-Request-Id`` is a label: clients sharing one are served side by side.

Before the server owned its request ids, four concurrent completions sent with the same
``X-Request-Id`` beside four plain ones answered all eight with 503 and restarted the DP group
(the duplicate key raised on a rank's engine thread). Now every request is keyed by an id of the
server's; the client's comes back in the ``x-request-id`` response header, and the rank
processes are the ones that started.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from helpers import COMPLETIONS

SHARED_ID = "dup-1"


def rank_pids(app) -> list[int]:
    return [app.rank_call("stats_snapshot", rank)["pid"] for rank in (0, 1)]


def post(url: str, i: int, headers: dict[str, str], stream: bool) -> httpx.Response:
    body = {
        "prompt": [11 + i, 12, 13, 14],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    return httpx.post(f"{url}{COMPLETIONS}", json=body, headers=headers, timeout=120)


def test_requests_sharing_a_client_id_and_their_neighbours_all_answer(app) -> None:
    pids = rank_pids(app)
    shared = {"x-request-id": SHARED_ID}
    jobs = [(i, shared, i % 2 == 1) for i in range(4)] + [(4 + i, {}, False) for i in range(4)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        responses = list(pool.map(lambda job: post(app.url, *job), jobs))
    assert [r.status_code for r in responses] == [200] * len(jobs), [r.text for r in responses]
    for (_, headers, stream), r in zip(jobs, responses, strict=True):
        if headers:
            assert r.headers["x-request-id"] == SHARED_ID  # the label comes back
        if not stream:
            assert r.json()["usage"]["completion_tokens"] == 8
        else:
            assert r.text.rstrip().endswith("data: [DONE]")
    body_ids = [r.json()["id"] for (_, _, s), r in zip(jobs, responses, strict=True) if not s]
    assert len(set(body_ids)) == len(body_ids)  # the server's ids, one per request
    assert rank_pids(app) == pids  # no rank restarted
