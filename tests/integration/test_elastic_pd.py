"""Elastic P/D: a decode role of two ranks (a MoE model, experts sharded over them) loses a rank
and serves on, with no stream lost.

pd.yaml is served in the shared app's place with ``elastic_dp``, ``tiny-moe``, one prefill rank
and two decode ranks; decode rank 1's process is SIGKILLed under 8 concurrent greedy streams.
Every stream completes with no error and the text an uninterrupted run gives, a new request is
answered while the decode role is one rank, and the role is back at two once Serve's
replacement joins. The fused shared app is put back after the module.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from helpers import BackgroundStream, complete, wait_for
from pd_deploy import pd_config

if TYPE_CHECKING:
    from integration.conftest import Deployment

pytestmark = pytest.mark.integration

DEADLINE_S = 240.0  # a condition's deadline (a replacement loads its model), not a speed
STREAM = {"max_tokens": 120, "ignore_eos": True, "temperature": 0}
PROMPTS = [[11, 12, 13 + i, 40 + 3 * i] for i in range(8)]


@pytest.fixture(scope="module")
def elastic_pd(app: Deployment) -> Iterator[Any]:
    """The P/D app in the shared app's place; its decode role's rank handle."""
    from ray import serve

    from roundgate.deployment.local import deploy, wait_ready

    port = app.cfg["http_options"]["port"]
    deploy(
        pd_config(
            port,
            model="tiny-moe",
            elastic_dp=True,
            moe_backend="torch",
            prefill={"dp_size": 1, "num_kv_pages": 256, "max_num_seqs": 16},
            decode={"dp_size": 2, "num_kv_pages": 256, "max_num_seqs": 16},
        )
    )
    wait_ready(app.url)
    try:
        yield serve.get_deployment_handle("DecodeRank", app_name="roundgate")
    finally:
        app.restore_after_faults()


def decode_stats(handle: Any, rank: int) -> dict[str, Any]:
    from roundgate.actors.control.messages import RankTarget

    return handle.stats_snapshot.remote(RankTarget(rank)).result(timeout_s=30)


def decode_sizes(handle: Any) -> list[int]:
    return [decode_stats(handle, r)["group_size"] for r in (0, 1)]


def test_a_killed_decode_rank_costs_no_stream(app: Deployment, elastic_pd: Any) -> None:
    decode = elastic_pd
    wait_for(lambda: decode_sizes(decode), DEADLINE_S, "a decode group of two",
             until=lambda s: s == [2, 2], errors=(Exception,))  # fmt: skip
    expected = [complete(app.url, prompt=p, **STREAM)["choices"][0]["text"] for p in PROMPTS]
    victim = decode_stats(decode, 1)
    streams = [BackgroundStream(app.url, prompt=p, **STREAM) for p in PROMPTS]
    for s in streams:
        assert s.started.wait(60), f"a stream never started: {s.error}"
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    answer = wait_for(
        lambda: complete(app.url, prompt=[3, 4, 5], max_tokens=4),
        DEADLINE_S,
        "a new request answered after the kill",
        errors=(httpx.HTTPError,),
    )
    answered_after_s = time.monotonic() - killed_at
    assert answer["choices"][0]["text"] is not None
    for s in streams:
        assert s.done.wait(DEADLINE_S), "a stream never ended"
    for i, s in enumerate(streams):
        assert s.error is None and not s.in_stream_errors(), (i, s.error, s.in_stream_errors())
        assert s.text() == expected[i], f"stream {i} differs from an uninterrupted run"
    wait_for(lambda: decode_sizes(decode), DEADLINE_S, "the decode group back at two",
             until=lambda s: s == [2, 2], errors=(Exception,))  # fmt: skip
    print(f"P/D decode kill: a new request answered {answered_after_s:.1f} s after it")
