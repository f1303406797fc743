"""Killing a rank mid-stream: callers get an error within the collective timeout, the gang
restarts (a fresh process group), and new requests are served again.

Named ``zz`` so it runs last in the session: it tears the shared group down on purpose.
"""

from __future__ import annotations

import time

import httpx
import ray

from tests.integration.helpers import BackgroundStream, wait_until


def test_killing_a_rank_fails_its_group_fast_and_the_gang_restarts(app) -> None:
    timeout_s = app.args["collective_timeout_s"]
    victim = app.rank_call("stats_snapshot", 1)
    stream = BackgroundStream(
        app.url, prompt=[1, 2, 3], max_tokens=3000, ignore_eos=True, dp_rank=0
    )
    assert stream.started.wait(60)
    killed_at = time.monotonic()
    ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=False)
    assert stream.done.wait(timeout_s + 15), "the stream on the surviving rank hung"
    assert stream.finished_at - killed_at <= timeout_s + 10
    errors = [e for e in stream.events if isinstance(e, dict) and "error" in e]
    assert errors or stream.error is not None, "the caller was not told about the failure"

    def served() -> bool:
        try:
            r = httpx.post(
                f"{app.url}/v1/completions", json={"prompt": "again", "max_tokens": 2}, timeout=30
            )
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    wait_until(served, timeout_s=180, interval_s=1.0)

    # Unpinned calls: in Ray 2.60 a restarted gang's members become routable one by one, and
    # a rank-pinned call issued in that window can wait on a stale replica set.
    new_ids = {app.ranks.stats_snapshot.remote().result(timeout_s=30)["gang_id"] for _ in range(4)}
    assert victim["gang_id"] not in new_ids and len(new_ids) == 1
