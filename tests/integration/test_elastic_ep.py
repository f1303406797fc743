"""Elastic expert parallelism served for real: a MoE group loses a rank and serves on.

The shared deployment is redeployed with ``elastic_dp`` and a tiny Qwen3-MoE directory (built
with transformers' classes) whose experts are sharded over the two ranks (torch all-to-all).
Rank 1's process is SIGKILLed (or SIGSTOPped) under 8 concurrent greedy streams: every stream
completes with no client-visible error and the text an uninterrupted run gives (the survivor's
go on, the dead rank's resume through the ingress), a new request is answered while the group
is one rank, whose experts were re-homed (``/metrics``: the slots read from the model's files),
and the group is back at two ranks once Serve's replacement joins. Then kills in a row (each
rank twice, so each replacement too) under streaming load fail no unpinned stream.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from family_models import build_family
from helpers import BackgroundStream, complete, wait_for
from test_elastic_dp import COLLECTIVE_TIMEOUT_S, kill_in_turn_under_load, snapshot, wait_whole
from test_served_deepseek import save_word_tokenizer

if TYPE_CHECKING:
    from integration.conftest import Deployment

pytestmark = pytest.mark.integration

DEADLINE_S = 240.0  # a condition's deadline (a replacement loads its model), not a speed
STREAM = {"max_tokens": 160, "ignore_eos": True, "temperature": 0}
PROMPTS = [[7, 8, 9 + i, 30 + 2 * i] for i in range(8)]


@pytest.fixture(scope="module")
def elastic_moe(app: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    path = Path(tmp_path_factory.mktemp("qwen3-moe-elastic"))
    model = build_family("qwen3_moe")
    model.save_pretrained(path)
    save_word_tokenizer(path, model.config.vocab_size)
    app.deploy(
        model=str(path),
        elastic_dp=True,
        moe_backend="torch",
        collective_timeout_s=COLLECTIVE_TIMEOUT_S,
    )
    try:
        yield app
    finally:
        app.restore_after_faults()


def rehomed(app: Deployment) -> dict[str, float]:
    """``roundgate_experts_rehomed_total`` summed by source, over every rank's series."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{app.url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "roundgate_experts_rehomed_total":
                out[s.labels["source"]] = out.get(s.labels["source"], 0.0) + s.value
    return out


@pytest.fixture(scope="module")
def uninterrupted(elastic_moe: Deployment) -> list[str]:
    """Each prompt's greedy text from the whole group, unfaulted: asked once for the module
    (both faults compare against it: greedy text does not depend on which process holds a
    seat), the eight at once, as the streams run."""
    wait_whole(elastic_moe, "one MoE group of two")
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(
            pool.map(lambda prompt: complete(elastic_moe.url, prompt=prompt, **STREAM), PROMPTS)
        )
    return [a["choices"][0]["text"] for a in answers]


@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_faulted_rank_of_a_moe_group_costs_no_stream(
    elastic_moe: Deployment, uninterrupted: list[str], fault: str
) -> None:
    """SIGKILL: the survivor's sockets reset at once; SIGSTOP: the hung rank is fenced when
    the survivor's collective times out (``collective_timeout_s``: 10 s here)."""
    app = elastic_moe
    wait_whole(app, "one MoE group of two")
    expected = uninterrupted
    before = rehomed(app)
    victim = snapshot(app, 1)
    streams = [BackgroundStream(app.url, prompt=prompt, **STREAM) for prompt in PROMPTS]
    for s in streams:
        assert s.started.wait(60), f"a stream never started: {s.error}"
    os.kill(victim["pid"], signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    killed_at = time.monotonic()
    try:
        if fault == "hang":  # fenced when the survivor's collective times out
            wait_for(
                lambda: snapshot(app, 0)["group_size"],
                DEADLINE_S,
                "rank 0 to re-form without the hung rank",
                until=lambda size: size == 1,
            )
            fenced_after_s = time.monotonic() - killed_at
            assert fenced_after_s < app.args["collective_timeout_s"] + 15, fenced_after_s
        # Unpinned after a kill (the ingress routes around the dead rank); pinned to the
        # survivor after a hang (Serve still routes to the stopped replica until its health
        # checks fail, a minute here).
        pin = {"dp_rank": 0} if fault == "hang" else {}
        answer = wait_for(
            lambda: complete(app.url, prompt=[3, 4, 5], max_tokens=4, **pin),
            DEADLINE_S,
            "a new request answered after the fault",
            errors=(httpx.HTTPError,),
        )
        answered_after_s = time.monotonic() - killed_at
        assert answer["choices"][0]["text"] is not None
        for s in streams:
            assert s.done.wait(DEADLINE_S), "a stream never ended"
    finally:
        if fault == "hang":
            os.kill(victim["pid"], signal.SIGCONT)  # it wakes fenced; Serve replaces it
    for i, s in enumerate(streams):
        assert s.error is None and not s.in_stream_errors(), (i, s.error, s.in_stream_errors())
        assert s.text() == expected[i], f"stream {i} differs from an uninterrupted run"
    # The lone survivor read rank 1's experts (one copy each) from the model's files.
    after = rehomed(app)
    assert after.get("files", 0.0) > before.get("files", 0.0), (before, after)
    wait_whole(app, "the replacement to join (one group of two again)")
    print(f"{fault}: a new request answered {answered_after_s:.1f} s after the fault")


def test_kills_in_turn_under_streaming_load_fail_no_unpinned_request(
    elastic_moe: Deployment,
) -> None:
    """Each rank killed in turn, each twice, under unpinned and pinned streams: no unpinned
    stream fails (``test_elastic_dp``'s check, on a MoE group)."""
    kill_in_turn_under_load(elastic_moe)
