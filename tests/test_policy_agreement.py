"""Property: every policy decides identically on every rank, from gathered rows alone.

Random rounds of gathered rows (every policy's extra columns included) are fed to one policy
instance per rank, as the rank loops would. Group policies must give every rank the same vote
each round. SGLang's delayer shares its decision (the reason) and then lets a rank admit only
if its own gathered row published a prefillable prompt, which every rank can read. vLLM's
interval and the local interval are per-rank by design (PEER_POLICIES.md); for them the
shared step clock must agree, and a rank's decision must be a function of the rows: a second
replica of the same rank, fed the same rows, votes the same.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from roundgate.actors.control.columns import READERS
from roundgate.gate import registry
from roundgate.gate.rows import RankRow, read_rows
from roundgate.gate.spec import PolicyContext

DP = 3
GROUP = ("roundgate", "roundgate-auto", "none", "trtllm-balance")
FLAGS = {
    "roundgate": {"prefill_attempt_interval": 2, "prefill_any_attempt_interval": 5},
    "local-interval": {"prefill_decode_interval": 2},
    "vllm-interval": {"prefill_schedule_interval": 2},
    "sglang-delayer": {"prefill_delayer_max_delay_passes": 4},
    "roundgate-auto": {"prefill_max_wait_ms": 120.0, "prefill_auto_hold_rounds": 1},
}
ALL_COLUMNS = tuple(READERS)


@st.composite
def rank_row(draw, now: int) -> tuple:
    extends = draw(st.integers(0, 2))
    decodes = draw(st.integers(0, 6))
    extras = {name: draw(st.integers(0, 12)) for name in ALL_COLUMNS}
    extras["kv_permille"] = draw(st.integers(0, 1000))
    extras["now_ms"] = now + draw(st.integers(0, 3))  # ranks' clocks differ a little
    wants = draw(st.booleans())
    return (decodes + extends, decodes + extends, extends, wants, decodes > 0, extras)


@st.composite
def rounds(draw) -> list[list[tuple]]:
    count = draw(st.integers(1, 24))
    out, now = [], 0
    for _ in range(count):
        now += draw(st.integers(1, 300))
        out.append([draw(rank_row(now)) for _ in range(DP)])
    return out


def build(name: str, rank: int):
    spec = registry.get(name)
    return spec.build(spec.make_config(FLAGS.get(name, {})), PolicyContext(rank, DP, 8))


def as_rows(policy, raw: list[tuple]) -> list[RankRow]:
    cols = policy.extra_columns
    return [RankRow(*r[:5], tuple(r[5][c] for c in cols)) for r in raw]


def play(name: str, history: list[list[tuple]]) -> list[list]:
    """Each round's votes, one per rank, from instances fed the same rows."""
    policies = [build(name, rank) for rank in range(DP)]
    out = []
    for raw in history:
        votes = []
        for policy in policies:
            rows = as_rows(policy, raw)
            votes.append(policy.vote(rows))
            policy.observe(rows, read_rows(rows))
        out.append(votes)
    return out


@settings(max_examples=25, deadline=None)
@given(history=rounds())
def test_group_policies_vote_the_same_on_every_rank(history) -> None:
    for name in GROUP:
        for votes in play(name, history):
            assert len(set(votes)) == 1, name


@settings(max_examples=25, deadline=None)
@given(history=rounds())
def test_sglang_shares_its_decision_and_reads_each_rank_from_its_own_row(history) -> None:
    policies = [build("sglang-delayer", rank) for rank in range(DP)]
    for raw in history:
        rows = as_rows(policies[0], raw)
        votes = [policy.vote(rows) for policy in policies]
        assert len({v.reason for v in votes}) == 1
        group_open = votes[0].reason != "delay"
        for rank, vote in enumerate(votes):
            assert vote.open == (group_open and rows[rank].extras[0] > 0)
        for policy in policies:
            policy.observe(rows, read_rows(rows))


@settings(max_examples=25, deadline=None)
@given(history=rounds())
def test_every_policy_is_a_function_of_the_rows(history) -> None:
    """Two replicas of each rank, fed the same rows, vote the same every round; vLLM's shared
    step clock is the same on every rank."""
    for name in registry.names():
        first, second = play(name, history), play(name, history)
        assert first == second, name
    clocks = [build("vllm-interval", rank) for rank in range(DP)]
    for raw in history:
        for policy in clocks:
            rows = as_rows(policy, raw)
            policy.vote(rows)
            policy.observe(rows, read_rows(rows))
        assert len({p.step_counter for p in clocks}) == 1
