"""vLLM's ``use_beam_search``: the step rule and ranking (pure), and the search through the
real HTTP app on a fake rank whose next-token distribution is a table, so where beam search
and greedy part ways is known in advance."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from ingress_fakes import tokens
from vllm_http import App, error

from roundgate.actors.control.messages import GenerateRequest
from roundgate.actors.control.request import TokenLogprobs
from roundgate.deployment.openai.beam_search import Beam, next_beams, score

A, B, X, Y, Z = (ord(c) for c in "ABxyz")
EOS = 257  # the tiny byte tokenizer's end of sequence
PROMPT = list(b"go")
# Next-token logprobs after each generated prefix. Greedy takes A (-0.4) and then only poor
# tokens follow it; B (-0.6) is followed by a sure x, so the best two-token beam is "Bx".
TABLE: dict[tuple[int, ...], dict[int, float]] = {
    (): {A: -0.4, B: -0.6, Z: -3.0, EOS: -5.0},
    (A,): {Y: -1.6, Z: -1.9, X: -2.5, EOS: -4.0},
    (B,): {X: -0.1, Y: -3.0, Z: -4.0, EOS: -6.0},
}
FLAT = {X: -1.0, Y: -1.5, Z: -2.0, EOS: -0.2}  # anywhere deeper: EOS is the likeliest


def table_rank() -> Any:
    """The rank: greedy on the table, with the top ``k`` logprobs asked for. What it has
    generated is what follows the first request's prompt (the rendered chat, or ``PROMPT``)."""
    prompt_len: list[int] = []

    def reply(message: GenerateRequest) -> list[Any]:
        ids = message.prompt_token_ids
        if not prompt_len:
            prompt_len.append(len(ids))
        dist = TABLE.get(tuple(ids[prompt_len[0] :]), FLAT)
        ranked = sorted(dist.items(), key=lambda kv: -kv[1])
        top = ranked[: message.sampling.logprobs or 0]
        token, logprob = ranked[0]
        lp = TokenLogprobs(logprob, tuple(t for t, _ in top), tuple(v for _, v in top))
        return [replace(tokens(token, finish="length", prompt=len(ids)), logprobs=(lp,))]

    return reply


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> App:
    app = App(monkeypatch, table_rank())
    app.core.eos_token_ids = (EOS,)
    return app


# ---- the rule --------------------------------------------------------------------------


def test_a_step_keeps_the_width_best_extensions_and_ends_beams_on_eos() -> None:
    beams = [Beam((A,), -0.4), Beam((B,), -0.6)]
    candidates = [[(Y, -1.6), (EOS, -0.1)], [(X, -0.1), (Y, -3.0)]]
    live, ended = next_beams(beams, candidates, 2, frozenset({EOS}))
    assert live == [Beam((B, X), -0.7), Beam((A, Y), -2.0)]
    assert ended == [Beam((A,), -0.5, "stop")]  # the EOS token itself is not kept


def test_ties_keep_the_earlier_beam_and_infinite_logprobs_are_never_taken() -> None:
    beams = [Beam((), 0.0), Beam((), 0.0)]
    live, _ = next_beams(beams, [[(X, -1.0)], [(Y, -1.0), (Z, -math.inf)]], 2, frozenset())
    assert [b.tokens for b in live] == [(X,), (Y,)]


def test_the_score_divides_by_the_length_with_the_prompt_raised_to_the_penalty() -> None:
    beam = Beam((X, Y), -3.0)
    assert score(beam, 4, 1.0) == -0.5
    assert score(beam, 4, 0.0) == -3.0  # no penalty: the raw sum
    assert score(beam, 2, 2.0) == -3.0 / 16


# ---- served ------------------------------------------------------------------------------


def texts(body: dict[str, Any]) -> list[str]:
    return [c["text"] for c in body["choices"]]


def test_greedy_takes_the_likeliest_first_token_and_misses_the_best_pair(app: App) -> None:
    status, greedy = app.complete(prompt="go", max_tokens=2, temperature=0)
    assert status == 200 and texts(greedy) == ["A"]  # the fake rank answers one token


def test_beam_search_finds_what_greedy_misses(app: App) -> None:
    status, body = app.complete(prompt="go", max_tokens=2, n=2, use_beam_search=True)
    assert status == 200, body
    assert texts(body) == ["Bx", "Ay"]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    # Every step asked the rank for one greedy token and the top 2 * width logprobs.
    steps = app.sent
    asked = {(m.sampling.max_tokens, m.sampling.logprobs, m.sampling.temperature) for m in steps}
    assert asked == {(1, 4, 0.0)}
    assert len(steps) == 1 + 2  # one beam first, then both
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


def test_an_eos_ended_beam_finishes_by_stop_and_is_ranked_by_length(app: App) -> None:
    # Depth 3: EOS (-0.2) is the likeliest after "Bx" and "Ay", so both end there, at -0.9
    # and -2.2 over 4 tokens (prompt included); "Bxx" (-1.7 over 5) stays live. Ranked by
    # score: Bx -0.225, Bxx -0.34, Bxy -0.44, Ay -0.55.
    status, body = app.complete(prompt="go", max_tokens=3, n=2, use_beam_search=True)
    assert status == 200
    assert texts(body) == ["Bx", "Bxx"]
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    status, body = app.complete(
        prompt="go", max_tokens=3, n=2, use_beam_search=True, length_penalty=0.0
    )
    assert texts(body) == ["Bx", "Bxx"]  # raw sums: -0.9, -1.7
    status, body = app.complete(
        prompt="go", max_tokens=3, n=2, use_beam_search=True, include_stop_str_in_output=True
    )
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]


def test_two_copies_of_a_prompt_get_the_same_beams(app: App) -> None:
    status, body = app.complete(prompt=["go", "go"], max_tokens=2, n=2, use_beam_search=True)
    assert status == 200 and texts(body) == ["Bx", "Ay", "Bx", "Ay"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]


def test_chat_beam_search_answers_the_best_beam_as_the_message(app: App) -> None:
    status, body = app.chat(max_tokens=2, n=2, use_beam_search=True)
    assert status == 200, body
    assert [c["message"]["content"] for c in body["choices"]] == ["Bx", "Ay"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"stream": True}, "stream"),
        ({"stop": ["x"]}, "stop"),
        ({"logprobs": 2}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"guided_regex": "a+"}, "guided_regex"),
        ({"n": 11}, "n"),  # 2n top logprobs past the default max_logprobs (20)
    ],
)
def test_what_beam_search_would_ignore_is_refused_by_name(
    app: App, body: dict[str, Any], param: str
) -> None:
    status, got, message = error(
        app.complete(prompt="go", max_tokens=2, use_beam_search=True, **{"n": 2, **body})
    )
    assert (status, got) == (400, param), message
    assert app.sent == []
