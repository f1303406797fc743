"""``roundgate-auto`` prices speculative decoding: the tokens a decode round yields and the
drafts it feeds are fitted from the gathered rows (``gate/decode_yield.py``), and the yield
spaces slow windows. Pure functions of rows, so every rank votes the same."""

from __future__ import annotations

import pytest

from roundgate.gate.auto import AutoGate, AutoGateConfig
from roundgate.gate.decode_yield import DecodeYield
from roundgate.gate.prefill_cost import prefill_tokens
from roundgate.gate.rows import RankRow, read_rows

DECODE_MS = 10


def spec_row(
    want: bool,
    decodes: int = 4,
    drafts: int = 0,
    extend_tokens: int = 0,
    accepted: int = 0,
    head_tokens: int = 230,
    backlog: int = 230,
    head: int = 0,
    now: int = 0,
) -> RankRow:
    """A rank's row for the auto gate: ``decodes`` decodes feeding ``drafts`` drafts each,
    one extend of ``extend_tokens`` if > 0, ``accepted`` kept drafts since the rank started."""
    extends = int(extend_tokens > 0)
    extras = (
        head_tokens if want else 0,
        head if want else 0,
        now,
        backlog if want else 0,
        accepted,
    )
    tokens = decodes * (1 + drafts) + extend_tokens
    return RankRow(tokens, decodes + extends, extends, want, decodes > 0, extras)


def feed_yield(fit: DecodeYield, rounds: int, kept_per_decode: int, decodes: int = 4) -> int:
    """``rounds`` decode-only rounds on two ranks, each decode keeping ``kept_per_decode`` of
    its 3 drafts; returns each rank's running total after."""
    total = 0
    for _ in range(rounds):
        rows = [spec_row(False, decodes, drafts=3, accepted=total) for _ in range(2)]
        fit.add_round(rows, 2 * total)
        total += decodes * kept_per_decode
    return total


@pytest.mark.parametrize("kept, expected", [(0, 1.0), (1, 2.0), (2, 3.0)])
def test_yield_is_kept_drafts_per_decode_plus_one(kept: int, expected: float) -> None:
    fit = DecodeYield()
    feed_yield(fit, 400, kept)
    assert fit.tokens_per_decode == pytest.approx(expected, rel=1e-3)
    assert fit.drafts_per_decode == pytest.approx(3.0)


def test_a_running_total_that_goes_down_is_a_new_baseline_not_a_sample() -> None:
    fit = DecodeYield()
    feed_yield(fit, 400, 1)
    rows = [spec_row(False, drafts=3) for _ in range(2)]
    fit.add_round(rows, 0)  # every rank restarted: the totals read 0 again
    fit.add_round(rows, 8)  # the next round's verifications kept 1 draft each
    assert fit.tokens_per_decode == pytest.approx(2.0, rel=1e-3)


def test_without_speculation_nothing_changes() -> None:
    fit = DecodeYield()
    rows = [spec_row(False), spec_row(False, extend_tokens=900)]
    for _ in range(50):
        fit.add_round(rows, 0)
    assert fit.tokens_per_decode == 1.0
    assert fit.drafts_per_decode == 0.0
    assert fit.extend_tokens(rows) == prefill_tokens(rows) == 900


def test_a_decoding_ranks_drafts_are_not_read_as_prompt_tokens() -> None:
    fit = DecodeYield()
    feed_yield(fit, 200, 1)  # decodes feed 3 drafts each
    # Rank 0 extends 100 tokens beside 4 decodes (12 drafts); rank 1 only verifies 40 x 3.
    rows = [spec_row(True, drafts=3, extend_tokens=100), spec_row(False, 40, drafts=3)]
    assert prefill_tokens(rows) == 120  # the drafts-blind reading takes rank 1's drafts
    assert fit.extend_tokens(rows) == 100


def learned(kept_per_decode: int, step_fixed: int = 190) -> tuple[AutoGate, int, int]:
    """A gate that has seen 10 ms verify rounds, each decode keeping ``kept_per_decode``
    drafts, and extends costing ``step_fixed`` ms plus 0.1 ms a token more; returns it, the
    clock and each rank's kept-draft total."""
    gate = AutoGate(AutoGateConfig())
    t = total = 0
    for tokens in [0, 0, 0, 1000, 0, 0, 0, 3000] * 2 + [0] * 300:
        rows = [
            spec_row(False, drafts=3, extend_tokens=tokens, accepted=total, now=t),
            spec_row(False, drafts=3, accepted=total, now=t),
        ]
        gate.vote(rows)
        gate.observe(rows, read_rows(rows))
        total += 4 * kept_per_decode
        t += DECODE_MS + (step_fixed + tokens // 10 if tokens else 0)
    return gate, t, total


def wait_until_open(gate: AutoGate, t: int, total: int, kept_per_decode: int) -> int:
    """Decode rounds in which rank 0 holds a prompt and rank 1 only decodes (no ALL point),
    until the gate opens; returns the prompt's age (ms) when it does."""
    for head in range(1, 2000):
        now = t + head * DECODE_MS
        rows = [
            spec_row(True, drafts=3, accepted=total, head=head, now=now),
            spec_row(False, drafts=3, accepted=total, now=now),
        ]
        vote = gate.vote(rows)
        if vote.open:
            return head * DECODE_MS
        gate.observe(rows, read_rows(rows))
        total += 4 * kept_per_decode
    raise AssertionError("the gate never opened")


@pytest.mark.parametrize(
    "kept, age_ms",
    [
        # No draft kept: one token a round, one slow window in 100 rounds (1,000 ms).
        (0, 1000),
        # Two tokens a round: a stream's 1 % of slow gaps comes twice as fast (500 ms).
        (1, 500),
        # Four tokens a round: 25 rounds.
        (3, 250),
    ],
)
def test_the_yield_spaces_slow_windows(kept: int, age_ms: int) -> None:
    # Every window here is slow (a 190 ms step on a 10 ms round, bound 200 ms), and the TTFT
    # slack (0.75 x (2000 - ~213) ms) is longer than the spacing: the yield sets the wait.
    gate, t, total = learned(kept)
    assert gate.yield_.tokens_per_decode == pytest.approx(1 + kept, rel=1e-3)
    assert wait_until_open(gate, t, total, kept) == pytest.approx(age_ms, abs=DECODE_MS)


def test_a_fast_window_opens_at_the_pace_whatever_the_yield() -> None:
    # A 20 ms step keeps the window under the bound: the yield does not hold it.
    for kept in (0, 2):
        gate, t, total = learned(kept, step_fixed=20)
        assert wait_until_open(gate, t, total, kept) <= 3 * DECODE_MS


def test_every_rank_fits_the_same_yield_and_votes_the_same() -> None:
    # Two ranks' gates fed the same gathered rows (prompts held, extends, kept drafts that
    # vary round to round) fit the same yield and vote the same every round.
    a, b = AutoGate(AutoGateConfig()), AutoGate(AutoGateConfig())
    t = total = 0
    votes = []
    for i in range(400):
        tokens = 2000 if i % 7 == 3 else 0
        rows = [
            spec_row(i % 5 == 0, drafts=2, extend_tokens=tokens, accepted=total, head=i % 5, now=t),
            spec_row(False, 9, drafts=2, accepted=total, now=t),
        ]
        votes.append((a.vote(rows), b.vote(rows)))
        for gate in (a, b):
            gate.observe(rows, read_rows(rows))
        total += 13 * (i % 3)
        t += DECODE_MS + (200 if tokens else 0)
    assert all(x == y for x, y in votes)
    assert a.yield_.tokens_per_decode == b.yield_.tokens_per_decode > 1.5
