"""Every prefill policy inside the real round: the scheduler's permission, the extra gather
columns, agreement across ranks, ServerArgs selection and simulator reproducibility."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

import pytest

from actors.control.gather import ThreadGather
from actors.control.rank_loop import RankLoop, RoundOutcome
from actors.control.request import Request, RequestStatus, SamplingParams
from actors.control.scheduler import Scheduler
from actors.policy_args import build_policy_for
from actors.server_args import ServerArgs
from deployment.sim.cost_executor import CostExecutor
from deployment.sim.report import summarize
from deployment.sim.round_costs import PRESETS, TOY
from deployment.sim.simulator import GroupSimulator
from deployment.sim.workload import Router, WorkloadSpec, generate
from gate.permission import ALLOW_ALL, CHUNKS_ONLY, HOLD_ALL, NEW_ONLY
from gate.policy import POLICIES

# The settings each policy needs to run (its own flags only).
POLICY_FLAGS: dict[str, dict] = {
    "roundgate": {"prefill_attempt_interval": 2, "prefill_any_attempt_interval": 6},
    "none": {},
    "local-interval": {"prefill_decode_interval": 3},
    "sglang-delayer": {"prefill_delayer_max_delay_passes": 5},
    "vllm-interval": {"prefill_schedule_interval": 2},
    "trtllm-balance": {"attention_dp_timeout_iters": 6, "attention_dp_batching_wait_iters": 2},
}
# Policies whose decision must be identical on every rank (vLLM's defer is per rank by design;
# the local interval looks at its own rank only).
GROUP_POLICIES = ("roundgate", "none", "sglang-delayer", "trtllm-balance")


def make_args(policy: str, dp_size: int = 2, **overrides) -> ServerArgs:
    values = {
        "dp_size": dp_size,
        "max_num_seqs": 4 * dp_size,
        "max_scheduled_tokens": 16,
        "page_size": 4,
        "num_kv_pages": 32,
        "prefill_policy": policy,
        **POLICY_FLAGS[policy],
    }
    return ServerArgs(**(values | overrides)).validate()


def make_loops(args: ServerArgs, gather: ThreadGather | None = None) -> list[RankLoop]:
    return [
        RankLoop(
            Scheduler(args),
            build_policy_for(args, rank),
            CostExecutor(TOY),
            args.dp_size,
            gather.for_rank(rank) if gather is not None else None,
            clock=lambda: 0.0,
        )
        for rank in range(args.dp_size)
    ]


def make_request(request_id: str, prompt_len: int, max_tokens: int = 4) -> Request:
    return Request(request_id, [3] * prompt_len, SamplingParams(max_tokens=max_tokens))


def drive_round(loops: Sequence[RankLoop]) -> list[RoundOutcome]:
    rows = [loop.begin() for loop in loops]
    return [loop.finish(rows) for loop in loops]


# --- the permission in the scheduler ------------------------------------------------------------


def resident_and_waiting() -> tuple[Scheduler, Request, Request]:
    """A rank with a half-prefilled prompt (budget 8 of 12 tokens) and a new prompt queued."""
    sched = Scheduler(
        ServerArgs(max_num_seqs=4, max_scheduled_tokens=8, page_size=4, num_kv_pages=32)
    )
    resident, new = make_request("resident", 12), make_request("new", 4)
    sched.add_request(resident)
    sched.plan(True)
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
    assert plan.permission == permission and plan.allow_prefill is permission.any


def test_plain_bools_still_mean_all_or_nothing() -> None:
    for allow, expected in ((True, ALLOW_ALL), (False, HOLD_ALL)):
        sched, _, _ = resident_and_waiting()
        assert sched.plan(allow_prefill=allow).permission == expected


# --- the extra columns ride the one gather ------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_rows_carry_the_policy_columns_in_one_packed_row(policy: str) -> None:
    loops = make_loops(make_args(policy))
    loops[0].scheduler.add_request(make_request("a", 6))
    row = loops[0].begin()
    columns = loops[0].policy.extra_columns
    assert len(row.extras) == len(columns)
    assert len(row.pack()) == 5 + len(columns)
    assert row.pack()[5:] == row.extras


def test_sglang_columns_read_the_scheduler_after_the_plan() -> None:
    (loop,) = make_loops(make_args("sglang-delayer", dp_size=1))
    loop.scheduler.add_request(make_request("a", 6))
    loop.scheduler.add_request(make_request("b", 30))
    columns = dict(zip(loop.policy.extra_columns, loop.begin().extras, strict=True))
    # a (6 tokens) and 10 of b's 30 fit the budget of 16: b is resident mid-chunk.
    assert columns["prefillable"] == 1 and columns["running"] == 2 and columns["waiting"] == 0
    assert columns["max_prefill_bs"] == 2
    assert columns["kv_permille"] == 1000 * 5 // 32  # 2 + 3 pages of 4 tokens


@pytest.mark.parametrize("policy", POLICIES)
def test_thread_gather_carries_extras_like_the_in_process_driver(policy: str) -> None:
    args = make_args(policy)
    arrivals = {0: [(0, "a", 9)], 1: [(1, "b", 20)], 4: [(0, "c", 3), (1, "d", 5)]}
    rounds = 24

    def summary(outcome: RoundOutcome) -> tuple:
        chunks = [(c.request.request_id, c.num_tokens) for c in outcome.plan.chunks]
        return outcome.vote, chunks, [r.pack() for r in outcome.rows]

    loops = make_loops(args)
    expected = []
    for rnd in range(rounds):
        for rank, rid, length in arrivals.get(rnd, []):
            loops[rank].scheduler.add_request(make_request(rid, length))
        expected.append([summary(o) for o in drive_round(loops)])

    gather = ThreadGather(2, timeout=10.0)
    threaded = make_loops(args, gather)
    got: list[list[tuple]] = [[], []]

    def rank_main(rank: int) -> None:
        for rnd in range(rounds):
            for where, rid, length in arrivals.get(rnd, []):
                if where == rank:
                    threaded[rank].scheduler.add_request(make_request(rid, length))
            got[rank].append(summary(threaded[rank].step()))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert [[got[0][i], got[1][i]] for i in range(rounds)] == expected


# --- agreement and reproducibility in the simulator ---------------------------------------------


def sim_args(policy: str, dp_size: int = 4) -> ServerArgs:
    return make_args(
        policy, dp_size, max_num_seqs=16 * dp_size, max_scheduled_tokens=256, num_kv_pages=256
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
    assert all(len({v for _, v in group}) == 1 for group in per_round)


@pytest.mark.parametrize("policy", POLICIES)
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
