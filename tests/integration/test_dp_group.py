"""The DP group on Ray: dp=2 rank replicas of the tiny MoE preset behind the real gate."""

from __future__ import annotations

import time

import pytest
from helpers import BackgroundStream, complete, stream_tokens, wait_until

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.server_args import ServerArgs

PROMPTS = [[72, 101, 108, 108, 111], list(range(30, 70)), [7] * 3, list(range(100, 230))]


@pytest.fixture(scope="module")
def offline_outputs(app) -> list[list[int]]:
    args = app.args
    engine = Engine(
        ServerArgs(
            model=args["model"],
            page_size=args["page_size"],
            max_scheduled_tokens=args["max_scheduled_tokens"],
            device="cpu",
        )
    )
    return engine.generate(PROMPTS, SamplingParams(max_tokens=12))


@pytest.mark.parametrize("rank", [0, 1])
def test_greedy_outputs_equal_offline_engine_on_every_rank(app, offline_outputs, rank) -> None:
    got = [stream_tokens(app.ranks, rank, p, 12) for p in PROMPTS]
    assert got == offline_outputs


def test_ranks_take_identical_gate_decisions(app) -> None:
    for i in range(6):
        complete(app.url, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=8, dp_rank=i % 2)
    logs = [
        {d[0]: tuple(d[:3]) for d in app.rank_call("stats_snapshot", r)["decisions"]}
        for r in (0, 1)
    ]
    common = sorted(set(logs[0]) & set(logs[1]))
    assert len(common) > 50
    assert [logs[0][k] for k in common] == [logs[1][k] for k in common]


def _prefill_rounds(stats: dict) -> dict[int, str | None]:
    return {d[0]: d[1] for d in stats["decisions"] if d[3] > 0}


def test_lone_backlog_prefills_only_at_any_points(app) -> None:
    """Rank 1 only decodes; every prompt goes to rank 0: rank 0 may prefill at ANY points
    only, because rank 1 (decoding, no backlog) blocks every ALL point."""
    decoder = BackgroundStream(
        app.url, prompt=[5, 6, 7], max_tokens=3000, ignore_eos=True, dp_rank=1
    )
    try:
        assert decoder.started.wait(60)
        start = app.rank_call("stats_snapshot", 0)["rounds"]
        for i in range(4):
            complete(app.url, prompt=PROMPTS[i], max_tokens=2, ignore_eos=True, dp_rank=0)
            time.sleep(0.05)
        assert not decoder.done.is_set(), "the decoding request ended early"
        stats = app.rank_call("stats_snapshot", 0)
    finally:
        decoder.close()
    prefills = {r: p for r, p in _prefill_rounds(stats).items() if r > start}
    assert len(prefills) >= 4
    assert set(prefills.values()) == {"any"}, prefills


def test_async_scheduling_serves_the_offline_tokens(redeploy, offline_outputs) -> None:
    """--async-scheduling in the served MoE gang (each round planned and gathered while the
    last one's forward runs; the gather on a process group of its own, made at the gang's
    join): every rank's greedy tokens are still the offline engine's."""
    redeploy.deploy(async_scheduling=True)
    for rank in (0, 1):
        assert [stream_tokens(redeploy.ranks, rank, p, 12) for p in PROMPTS] == offline_outputs


def test_prompts_on_both_ranks_prefill_in_the_same_rounds(redeploy) -> None:
    # A long ANY interval: with both ranks decoding, only ALL points (both want) open.
    redeploy.deploy(prefill_any_attempt_interval=400)
    app = redeploy
    decoders = [
        BackgroundStream(app.url, prompt=[9, 9], max_tokens=3000, ignore_eos=True, dp_rank=r)
        for r in (0, 1)
    ]
    try:
        assert all(d.started.wait(60) for d in decoders)
        start = min(app.rank_call("stats_snapshot", r)["rounds"] for r in (0, 1))
        bursts = [
            BackgroundStream(
                app.url, prompt=PROMPTS[r + 1], max_tokens=2, ignore_eos=True, dp_rank=r
            )
            for r in (0, 1)
        ]
        assert all(b.done.wait(120) for b in bursts)
        stats = [app.rank_call("stats_snapshot", r) for r in (0, 1)]
    finally:
        for d in decoders:
            d.close()
    rounds = [{k for k in _prefill_rounds(s) if k > start} for s in stats]
    assert rounds[0] and rounds[0] == rounds[1]


def test_client_disconnect_aborts_and_frees_pages(app) -> None:
    streams = [
        BackgroundStream(app.url, prompt=PROMPTS[r], max_tokens=3000, ignore_eos=True, dp_rank=r)
        for r in (0, 1)
    ]
    assert all(s.started.wait(60) for s in streams)
    for s in streams:
        s.close()

    def drained() -> bool:
        stats = [app.rank_call("stats_snapshot", r) for r in (0, 1)]
        return all(
            s["running"] == 0 and s["waiting"] == 0 and s["kv_occupancy"] == 0 for s in stats
        )

    wait_until(drained, timeout_s=30)
    assert sum(app.rank_call("stats_snapshot", r)["aborts"] for r in (0, 1)) >= 2
    assert all(app.rank_call("check_pool", r) for r in (0, 1))
