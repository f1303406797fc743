"""Decode graphs under attention DP with MoE, two gloo ranks: every rank replays the group's
bucket, the idle rank included, and the logits equal a single process running eagerly.

Each rank is its own process holding half of tiny-moe's experts; every MoE layer is an
all-to-all between them, so a rank that ran a different batch size than its peer would
exchange mismatched rows and a rank that skipped the forward would hang the other. The
ranks run the per-bucket static-buffer path (``capture=False``: what a CPU can run, over
the Triton kernels under the interpreter), each round through ``ModelRunner.execute`` with
the round's gathered rows, as the rank loop calls it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from model_driver import grow_pages, next_chunk
from test_expert_parallel import assert_rank_matches, free_port, moe_args, run_ranks

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.request import Request
from roundgate.actors.control.round import RoundPlan
from roundgate.actors.model.runner import ModelRunner
from roundgate.gate.rows import RankRow
from roundgate.kernels.triton_env import interpreter_enabled

PROMPTS = {"a": [1, 2, 3, 4, 5, 6, 7], "b": [40, 41, 42], "c": [9, 8, 7, 6, 5, 4, 3, 2, 1]}
HOME = {"a": 0, "b": 0, "c": 1}
# Per round, the requests each rank runs, and the bucket the group replays (None: eager).
ROUNDS: list[tuple[dict[int, list[str]], int | None]] = [
    ({0: ["a", "b"], 1: ["c"]}, None),  # both extend: eager, normal legs
    ({0: ["a", "b"], 1: []}, 2),  # rank 1 idle: it replays a bucket of 2 padding rows
    ({0: [], 1: ["c"]}, 1),  # rank 0 idle
    ({0: ["a", "b"], 1: ["c"]}, 2),  # 2 decodes and 1: rank 1 pads to the group's 2
    ({0: ["a"], 1: ["c"]}, 1),
]


def names_of(round_index: int, rank: int | None) -> list[str]:
    """The requests ``rank`` runs in a round (``None``: every request, one process)."""
    plan = ROUNDS[round_index][0]
    return plan[rank] if rank is not None else [n for r in sorted(plan) for n in plan[r]]


def gathered_rows(round_index: int, ranks: tuple[int | None, ...]) -> list[RankRow]:
    """The rows of ``ranks`` in a round: a request extends in its first round."""
    rows = []
    for rank in ranks:
        names = names_of(round_index, rank)
        first = {n: min(i for i, (r, _) in enumerate(ROUNDS) if n in r[HOME[n]]) for n in names}
        extends = sum(first[n] == round_index for n in names)
        rows.append(RankRow(len(names), len(names), extends, False, bool(names)))
    return rows


def play(runner: ModelRunner, rank: int | None) -> tuple[dict[str, list[torch.Tensor]], list]:
    """Every round through ``execute`` (``rank`` None: all requests in one process); the
    logits of each request's steps, and per round (group bucket, replays)."""
    pool = KVPool(PoolConfig(64, 4))
    requests = {name: Request(name, prompt) for name, prompt in PROMPTS.items()}
    logits: dict[str, list[torch.Tensor]] = {name: [] for name in PROMPTS}
    forward, outputs = runner.forward, []

    def recording(*args: Any, **kwargs: Any) -> torch.Tensor:
        outputs.append(forward(*args, **kwargs))
        return outputs[-1]

    runner.forward = recording  # type: ignore[method-assign]
    replays = []
    for round_index in range(len(ROUNDS)):
        chunks = [next_chunk(requests[n], chunk_size=1 << 30) for n in names_of(round_index, rank)]
        for chunk in chunks:
            grow_pages(pool, chunk.request, chunk.end)
        rows = gathered_rows(round_index, (0, 1) if rank is not None else (None,))
        graphs, outputs[:] = runner.graphs, []
        before = graphs.num_replays if graphs is not None else 0
        result = runner.execute(RoundPlan(chunks=chunks), rows)
        if graphs is not None:
            replays.append((graphs.round_bucket(rows), graphs.num_replays - before))
        for i, chunk in enumerate(chunks):
            logits[chunk.request.request_id].append(outputs[0][i])
            chunk.request.num_computed_tokens = chunk.end
            chunk.request.append_token(result.sampled[chunk.request.request_id])
    return logits, replays


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # keep every socket on 127.0.0.1
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        runner = ModelRunner(moe_args("tiny-moe", 2, "triton"), rank=rank)
        runner.graphs = runner.decode_graphs(capture=False)  # a CPU never captures
        runner.graphs.capture_all()
        torch.save(play(runner, rank), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.triton
def test_two_ranks_replay_the_groups_bucket_and_equal_one_process(tmp_path: Path) -> None:
    if not (interpreter_enabled() or torch.cuda.is_available()):
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
    run_ranks(_rank_main, (free_port(), str(tmp_path)), 2, "decode-graph ranks")
    expected, _ = play(ModelRunner(moe_args("tiny-moe", 1, "triton")), rank=None)
    for rank in (0, 1):
        got, replays = torch.load(tmp_path / f"rank{rank}.pt")
        # The same bucket on both ranks every round, replayed by the idle rank too.
        assert replays == [(bucket, 0 if bucket is None else 1) for _, bucket in ROUNDS], rank
        assert_rank_matches(got, expected, rank, HOME)
