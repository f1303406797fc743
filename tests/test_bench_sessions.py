"""``roundgate bench --sessions``: the conversation a client sends, against a fake server."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from roundgate.bench.cli import session_workload
from roundgate.bench.report import format_table, summarize
from roundgate.bench.sessions import hit_rate, run_sessions
from roundgate.cli.main import build_parser


def bench_ns(*extra: str):
    return build_parser().parse_args(["bench", "--sessions", "chat-sessions", *extra])


def fake_server(sent: list[dict]) -> httpx.MockTransport:
    """Answers each completion with two streamed chunks of token ids (7 + turn, 8)."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        first = 7 + sum(1 for b in sent if b["user"] == body["user"]) - 1
        events = [
            {"choices": [{"text": "a", "token_ids": [first], "finish_reason": None}]},
            {"choices": [{"text": "b", "token_ids": [8], "finish_reason": "length"}]},
            {"choices": [], "usage": {"completion_tokens": 2}},
        ]
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handle)


def test_each_turn_resends_the_conversation_with_the_servers_answer() -> None:
    ns = bench_ns("--num-sessions", "2", "--turns", "3", "--think-s", "0.001", "--rate", "1000")
    sessions = session_workload(ns)
    sent: list[dict] = []
    results, _ = asyncio.run(run_sessions("http://x", "m", sessions, transport=fake_server(sent)))
    assert len(results) == len(sent) == 6 and all(r.ok for r in results)
    for session in sessions:
        user = f"session-{session.session_id}"
        prompts = [b["prompt"] for b in sent if b["user"] == user]
        assert prompts[0] == [*session.system, *session.user_turns[0]]
        for turn in (1, 2):
            answer = [7 + turn - 1, 8]
            assert prompts[turn] == [*prompts[turn - 1], *answer, *session.user_turns[turn]]
    assert all(b["return_token_ids"] and b["ignore_eos"] for b in sent)
    summary = summarize(results, 1.0, 1e9, 1e9)
    assert summary["ttft_first_turn_ms"]["p50"] is not None
    assert summary["ttft_later_turns_ms"]["p50"] is not None
    assert "hit rate" in format_table([("run", summary)])


def test_session_overrides_and_their_refusals() -> None:
    sessions = session_workload(bench_ns("--system-len", "10", "--turns", "2", "--output-len", "4"))
    assert len(sessions[0].system) == 10 and sessions[0].num_turns == 2
    assert all(2 <= n <= 6 for n in sessions[0].output_lens)
    with pytest.raises(ValueError, match="--turns must be > 0"):
        session_workload(bench_ns("--turns", "0"))


R0, R1, OLD = (("dp_rank", "0"),), (("dp_rank", "1"),), (("group", "old"),)


@pytest.mark.parametrize(
    ("before", "after", "rate"),
    [
        ({R0: (100, 20)}, {R0: (300, 120)}, 0.5),
        ({R0: (0, 0)}, {R0: (0, 0)}, None),
        (None, {R0: (1, 1)}, None),
        # A rank that appeared between the readings counts from zero.
        ({R0: (100, 20)}, {R0: (200, 70), R1: (100, 50)}, 0.5),
        # A replaced group's series, still in the first reading only, does not count.
        ({OLD: (1000, 900), R0: (0, 0)}, {R0: (100, 25)}, 0.25),
    ],
)
def test_hit_rate_between_two_readings(before, after, rate) -> None:
    assert hit_rate(before, after) == rate


def test_the_default_config_of_serve_and_bench_compare_is_the_shipped_local_yaml() -> None:
    """Both commands fall back to ``deployment/configs/local.yaml``; the file must exist there
    (the re-housing moved it once and left both defaults pointing at a missing path)."""
    parser = build_parser()
    for argv in (["serve"], ["bench", "--compare", "none"]):
        config = parser.parse_args(argv).config
        assert config.is_file(), (argv, config)
        assert config.parts[-3:] == ("deployment", "configs", "local.yaml")
