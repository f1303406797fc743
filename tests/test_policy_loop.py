"""Every prefill policy inside the real round: the scheduler's permission, the extra gather
columns, agreement across ranks and simulator reproducibility. (That a real gather between
threads gives every policy the same rounds as the in-process driver is in test_dp_round.py.)"""

from __future__ import annotations

import json

import pytest
from builders import drive_round, make_args, make_loops, make_request, make_scheduler

from roundgate.actors.control.request import Request, RequestStatus
from roundgate.actors.control.scheduler import Scheduler
from roundgate.actors.server_args import ServerArgs
from roundgate.gate import registry
from roundgate.gate.permission import ALLOW_ALL, CHUNKS_ONLY, HOLD_ALL, NEW_ONLY
from roundgate.sim.report import summarize
from roundgate.sim.round_costs import PRESETS
from roundgate.sim.router import Router
from roundgate.sim.simulator import GroupSimulator
from roundgate.sim.workload import WorkloadSpec, generate

# Policies whose decision must be identical on every rank (vLLM's defer is per rank by design;
# the local interval looks at its own rank only).
GROUP_POLICIES = ("roundgate", "none", "sglang-delayer", "trtllm-balance")


# --- the permission in the scheduler ------------------------------------------------------------


def resident_and_waiting() -> tuple[Scheduler, Request, Request]:
    """A rank with a half-prefilled prompt (budget 8 of 12 tokens) and a new prompt queued."""
    sched = make_scheduler(max_scheduled_tokens=8)
    resident, new = make_request("resident", 12), make_request("new", 4)
    sched.add_request(resident)
    sched.plan(ALLOW_ALL)
    sched.add_request(new)
    return sched, resident, new


@pytest.mark.parametrize(
    ("permission", "chunk_runs", "new_admitted"),
    [
        (ALLOW_ALL, True, True),
        (CHUNKS_ONLY, True, False),  # SGLang's DELAY
        (NEW_ONLY, False, True),
        (HOLD_ALL, False, False),  # our gate closed, vLLM's defer, TRT-LLM's hold
    ],
)
def test_permission_bits_gate_chunks_and_new_prompts_separately(
    permission, chunk_runs: bool, new_admitted: bool
) -> None:
    sched, _, new = resident_and_waiting()
    plan = sched.plan(permission)
    planned = {c.request.request_id for c in plan.chunks if c.is_prefill}
    assert ("resident" in planned) is chunk_runs
    assert ("new" in planned) is new_admitted
    assert (new.status is RequestStatus.WAITING) is not new_admitted
    assert plan.permission == permission


# --- the extra columns ride the one gather ------------------------------------------------------


@pytest.mark.parametrize("policy", registry.names())
def test_rows_carry_the_policy_columns_in_one_packed_row(policy: str) -> None:
    loops = make_loops(make_args(2, policy))
    loops[0].scheduler.add_request(make_request("a", 6))
    row = loops[0].begin()
    columns = loops[0].policy.extra_columns
    assert len(row.extras) == len(columns)
    assert len(row.pack()) == 5 + len(columns)
    assert row.pack()[5:] == row.extras


def test_sglang_columns_read_the_scheduler_after_the_plan() -> None:
    (loop,) = make_loops(make_args(1, "sglang-delayer"))
    loop.scheduler.add_request(make_request("a", 6))
    loop.scheduler.add_request(make_request("b", 30))
    # Round 1 publishes the fresh prompts (prefillable, nothing admitted yet); round 2 plans.
    (outcome,) = drive_round([loop])
    first = dict(zip(loop.policy.extra_columns, outcome.rows[0].extras, strict=True))
    assert first["prefillable"] == 1 and first["running"] == 0 and first["waiting"] == 2
    columns = dict(zip(loop.policy.extra_columns, loop.begin().extras, strict=True))
    # a (6 tokens) and 10 of b's 30 fit the budget of 16: b is resident mid-chunk.
    assert columns["prefillable"] == 1 and columns["running"] == 2 and columns["waiting"] == 0
    assert columns["max_prefill_bs"] == 2
    assert columns["kv_permille"] == 1000 * 5 // 32  # 2 + 3 pages of 4 tokens


# --- agreement and reproducibility in the simulator ---------------------------------------------


def sim_args(policy: str, dp_size: int = 4) -> ServerArgs:
    return make_args(
        dp_size, policy, max_num_seqs=16 * dp_size, max_scheduled_tokens=256, num_kv_pages=256
    )


SPEC = WorkloadSpec(num_requests=60, rate=40.0, input_len=120, output_len=12, length_dist="uniform")


@pytest.mark.parametrize("policy", GROUP_POLICIES)
def test_group_policies_decide_identically_on_every_rank(policy: str) -> None:
    args = sim_args(policy)
    sim = GroupSimulator(args, PRESETS["h100-dsv3"], Router("skewed", 4, [5, 1, 1, 1]), policy)
    votes: list[list] = []
    for loop in sim.loops:
        vote = loop.policy.vote

        def spy(rows, local=None, vote=vote, loop=loop):
            result = vote(rows, local)
            votes.append((id(loop), result))
            return result

        loop.policy.vote = spy  # type: ignore[method-assign]
    result = sim.run(generate(SPEC))
    assert result.unfinished == 0
    per_round = [votes[i : i + 4] for i in range(0, len(votes), 4)]
    assert per_round and len(votes) % 4 == 0
    # Each group of four is one round: every rank voted once, and all four votes agree (for
    # SGLang the group's decision, its reason: a rank that published nothing prefillable
    # does not admit on an ALLOW, read from its own gathered row).
    assert all(len({who for who, _ in group}) == 4 for group in per_round)
    key = (lambda v: v.reason) if policy == "sglang-delayer" else (lambda v: v)
    assert all(len({key(v) for _, v in group}) == 1 for group in per_round)


@pytest.mark.parametrize("policy", registry.names())
def test_same_seed_same_summary_for_every_policy(policy: str) -> None:
    def run() -> str:
        args = sim_args(policy)
        sim = GroupSimulator(
            args, PRESETS["h100-dsv3"], Router("skewed", 4, [5, 1, 1, 1], seed=3), policy
        )
        return json.dumps(summarize(sim.run(generate(SPEC))), sort_keys=True)

    first = run()
    assert first == run()
    assert json.loads(first)["unfinished"] == 0
