"""The real torch.distributed gather, two gloo ranks on loopback, with every policy's columns.

Each rank is its own process (as in a served group) and runs every registered policy in turn
for ``ROUNDS`` rounds: it builds its row (the gate's five columns and the policy's extra ones,
values chosen per policy, round and rank), gathers it through ``TorchGather``, votes on the
gathered rows and observes them. The test then checks that both ranks received exactly the
rows the ranks put in (every extra column, a wall-clock ms stamp past 32 bits included), and
that every decision equals the one that rank's policy takes from the rows as put in: the
gather carried everything the policies read. Group policies also vote the same on both ranks.
Each rank also counts its host reads of a tensor (``tolist``, ``item`` and the other ways a
tensor becomes host values) inside every gather: one a round, as on NCCL, where each is a sync.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from roundgate.actors.control.columns import READERS
from roundgate.gate import registry
from roundgate.gate.rows import NUM_COLUMNS, RankRow, read_rows
from roundgate.gate.spec import PolicyContext
from roundgate.gate.vote import GateVote

WORLD = 2
ROUNDS = 40
MAX_BATCH = 8
TIMEOUT_S = 120.0  # a deadline for the two processes, not an expectation of speed
# Policies whose vote is the group's: identical on every rank (PEER_POLICIES.md). SGLang's
# delayer shares its reason and then reads each rank's own row; the interval policies are per
# rank by design. Every policy's decisions are also checked against the rows as put in.
GROUP_POLICIES = ("roundgate", "roundgate-auto", "none", "trtllm-balance")
SHARED_REASON = ("sglang-delayer",)
START_MS = 1_764_000_000_000  # a wall-clock stamp in ms: needs all of int64, not int32

Decision = tuple[bool, str | None, bool | None, str | None]


def planned_row(name: str, columns: tuple[str, ...], round_: int, rank: int) -> RankRow:
    """The row ``rank`` puts in at ``round_`` for policy ``name``: the same in every process
    (a string seed); counts small enough that every policy both opens and holds."""
    rng = random.Random(f"{name}/{round_}/{rank}")
    # Extends in a third of the rounds, about as often as a paced gate opens (a gate whose
    # credit every round spent would never open, and the test needs both outcomes).
    extends, decodes = rng.choice((0, 0, 0, 0, 1, 2)), rng.randint(0, 6)
    values = {column: rng.randint(0, 5) for column in READERS}
    values["kv_permille"] = rng.randint(0, 1000)
    values["now_ms"] = START_MS + 40 * round_ + rng.randint(0, 3)  # ranks' clocks differ a bit
    return RankRow(
        decodes + extends,
        decodes + extends,
        extends,
        rng.random() < 0.6,
        decodes > 0,
        tuple(values[c] for c in columns),
    )


def build(name: str, rank: int) -> Any:
    flags = registry.comparison_flags(name, {})
    return registry.build(name, flags, PolicyContext(rank, WORLD, MAX_BATCH))


def decision(vote: GateVote) -> Decision:
    return (vote.open, vote.point, vote.chunks, vote.reason)


# Every way a tensor hands its values to the host (on a GPU, each is a copy and a sync).
HOST_READS = ("tolist", "item", "numpy", "__int__", "__float__", "__bool__", "__index__")


@contextlib.contextmanager
def counting_host_reads() -> Iterator[list[int]]:
    """Patch ``HOST_READS`` on ``torch.Tensor``; yields a one-item list: the reads so far."""
    import torch

    count = [0]
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(method: Any) -> Any:
        def read(self: Any, *args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return method(self, *args, **kwargs)

        return read

    for name, method in originals.items():
        setattr(torch.Tensor, name, counted(method))
    try:
        yield count
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def rank_main(rank: int, init_method: str, names: tuple[str, ...], out: Any) -> None:
    """One rank: every policy's rounds through the real gather; sends back, per policy, the
    rows it received, the decisions it took and each gather's host reads."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo's pair sockets on 127.0.0.1
    import torch.distributed as dist

    from roundgate.actors.replica.torch_gather import TorchGather

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD)
    try:
        gather = TorchGather()
        results = {}
        for name in names:
            policy = build(name, rank)
            received, decisions, reads = [], [], []
            for round_ in range(ROUNDS):
                row = planned_row(name, policy.extra_columns, round_, rank)
                with counting_host_reads() as count:
                    packed = gather.all_gather(row.pack())
                reads.append(count[0])
                rows = [RankRow.unpack(p) for p in packed]
                received.append([r.pack() for r in rows])
                decisions.append(decision(policy.vote(rows)))
                policy.observe(rows, read_rows(rows))
            results[name] = (received, decisions, reads)
        out.put((rank, results))
    except BaseException:
        # Said at once: the peer may be blocked in a gather this rank will never join.
        out.put((rank, traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gathered(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """Both ranks' received rows and decisions for every registered policy."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{Path(tmp_path_factory.mktemp('gather')) / 'store'}"
    procs = [
        ctx.Process(target=rank_main, args=(rank, init, registry.names(), out))
        for rank in range(WORLD)
    ]
    for proc in procs:
        proc.start()
    results = {}
    try:
        for _ in procs:
            rank, result = out.get(timeout=TIMEOUT_S)
            if isinstance(result, str):
                pytest.fail(f"rank {rank} failed:\n{result}")
            results[rank] = result
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    assert [proc.exitcode for proc in procs] == [0] * WORLD
    return results


def reference(name: str, rank: int) -> tuple[list[list[tuple[int, ...]]], list[Decision]]:
    """The rows as the ranks put them in, and ``rank``'s decisions on them, in-process."""
    policy = build(name, rank)
    rows_by_round, decisions = [], []
    for round_ in range(ROUNDS):
        rows = [planned_row(name, policy.extra_columns, round_, r) for r in range(WORLD)]
        rows_by_round.append([r.pack() for r in rows])
        decisions.append(decision(policy.vote(rows)))
        policy.observe(rows, read_rows(rows))
    return rows_by_round, decisions


def test_the_table_covers_every_registered_policy() -> None:
    assert set(GROUP_POLICIES + SHARED_REASON) <= set(registry.names())


@pytest.mark.parametrize("name", registry.names())
def test_two_ranks_gather_every_column_and_decide_as_from_the_rows_put_in(
    gathered: dict[int, dict[str, Any]], name: str
) -> None:
    width = NUM_COLUMNS + len(build(name, 0).extra_columns)
    for rank in range(WORLD):
        received, decisions, _ = gathered[rank][name]
        put_in, expected = reference(name, rank)
        assert all(len(p) == width for rows in received for p in rows), name
        for round_, (got, want) in enumerate(zip(received, put_in, strict=True)):
            assert got == want, f"{name}: rank {rank} received other rows in round {round_}"
        assert decisions == expected, f"{name}: rank {rank} decided otherwise than on its rows"
        # The rows exercise both outcomes (``none`` only ever opens), so agreeing means something.
        assert {d[0] for d in expected} == ({True} if name == "none" else {True, False}), name
    votes = [gathered[rank][name][1] for rank in range(WORLD)]
    if name in GROUP_POLICIES:
        assert votes[0] == votes[1], f"{name}: the ranks voted differently"
    if name in SHARED_REASON:
        reasons = [[d[3] for d in rank_votes] for rank_votes in votes]
        assert reasons[0] == reasons[1], f"{name}: the ranks' reasons differ"


def test_a_round_reads_the_gathered_rows_back_once(gathered: dict[int, dict[str, Any]]) -> None:
    """One host read per gather on every rank, whatever the policy's width: the rows come
    back in one copy (on NCCL, one sync a round instead of one per rank)."""
    for rank in range(WORLD):
        for name in registry.names():
            reads = gathered[rank][name][2]
            assert reads == [1] * ROUNDS, f"{name}: rank {rank} read the gather back {reads}"
