"""Session workloads in the simulator: shared prefixes, growing context, think time, closed
loop; the ranks' real prefix caches and the cache-aware router on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_builders import sim_args

from roundgate.cli.main import main
from roundgate.routing.cache_aware import CacheAwareConfig
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import Router
from roundgate.sim.sessions import SessionPreset, SessionSpec, first_turns, make_sessions
from roundgate.sim.simulator import GroupSimulator

SMALL = SessionPreset(
    system_len=64, first_user_len=20, user_len=24, output_len=8, turns=4, think_s=0.2
)
SPEC = SessionSpec(SMALL, num_sessions=12, rate=20.0, seed=3)


def run(router: str = "round-robin", caching: bool = True, spec: SessionSpec = SPEC, **flags):
    args = sim_args("roundgate", dp_size=4, enable_prefix_caching=caching, **flags)
    config = CacheAwareConfig(page_size=args.page_size, max_pages_per_rank=args.num_kv_pages)
    sim = GroupSimulator(
        args, PRESETS["h100-dsv3"], Router(router, 4, seed=0, cache_aware=config), "roundgate"
    )
    return sim.run(first_turns(spec))


def test_sessions_are_seeded_and_share_one_system_prompt() -> None:
    a, b = make_sessions(SPEC), make_sessions(SPEC)
    assert [s.user_turns for s in a] == [s.user_turns for s in b]
    assert len({s.system for s in a}) == 1 and len(a[0].system) == 64
    assert [s.start_s for s in a] == sorted(s.start_s for s in a)
    first = a[0].first_turn()
    assert first.token_ids == (*a[0].system, *a[0].user_turns[0]) and first.turn == 0


def test_a_turn_resends_the_conversation_and_its_answer_after_the_think_time() -> None:
    session = make_sessions(SPEC)[0]
    first = session.first_turn()
    second = session.next_turn(first, 2.0, [0, 0, 0])
    assert second.token_ids == (*first.token_ids, 0, 0, 0, *session.user_turns[1])
    assert second.time_s == pytest.approx(2.0 + session.think_s[0])
    assert second.turn == 1 and second.output_tokens == session.output_lens[1]
    last = first
    for _ in range(SMALL.turns - 1):
        last = session.next_turn(last, 0.0, [0])
    assert session.next_turn(last, 0.0, [0]) is None


def test_every_turn_runs_and_later_turns_hit_the_cache() -> None:
    cached, plain = run(), run(caching=False)
    for result in (cached, plain):
        assert result.unfinished == 0 and len(result.records) == 12 * SMALL.turns
        assert {r.turn for r in result.records} == set(range(SMALL.turns))
    assert plain.prefix_hits == plain.prefix_queries == 0
    assert cached.prefix_hits > 0 and cached.prefix_queries > cached.prefix_hits
    summary = summarize(cached)
    assert summary["prefix_hit_rate"] == round(cached.prefix_hits / cached.prefix_queries, 4)
    assert summary["ttft_later_turns_ms"]["p50"] is not None


def test_a_session_list_replays_identically() -> None:
    assert summarize(run()) == summarize(run())


def test_cache_aware_routing_reuses_more_than_round_robin() -> None:
    rates = {r: summarize(run(r))["prefix_hit_rate"] for r in ("round-robin", "cache-aware")}
    assert rates["cache-aware"] > rates["round-robin"]


def test_unrelated_prompts_never_share_pages() -> None:
    """Plain workloads get distinct filler prompts: caching on finds nothing to reuse."""
    from sim_builders import simulate

    assert simulate(enable_prefix_caching=True)["prefix_hit_rate"] == 0.0


BASE = [
    "simulate",
    "--dp-size", "2",
    "--max-num-seqs", "16",
    "--num-kv-pages", "256",
    "--page-size", "16",
    "--num-sessions", "3",
    "--rate", "20",
    "--no-progress",
]  # fmt: skip


def test_the_cli_runs_session_workloads_and_reports_the_hit_rate(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    argv = [*BASE, "--workload", "chat-sessions", "--router", "cache-aware", "--json", str(out)]
    assert main(argv) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["unfinished"] == 0 and result["requests"] == 3 * 5
    assert 0 < result["prefix_hit_rate"] < 1


def test_a_session_that_outgrows_the_pool_is_refused_by_flag(capsys) -> None:
    argv = [*BASE, "--workload", "agentic-sessions", "--num-kv-pages", "64"]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "--workload agentic-sessions" in capsys.readouterr().err
