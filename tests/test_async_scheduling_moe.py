"""``--async-scheduling`` in an expert-parallel group: two gloo ranks of tiny-moe, each an
``EngineCore`` over the real ``ModelRunner`` (half the experts each, an all-to-all in every
MoE layer) and a ``TorchGather``. With overlap the forward of round N runs on a worker thread
while round N+1 is gathered, so the gather has a process group of its own (as a gang rank's
``GangMembership`` makes it); a collective of one that met the other's would hang or mix
rows. Every request's tokens equal the synchronous run's, on both ranks.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_expert_parallel import free_port, moe_args, run_ranks

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.replica.torch_gather import TorchGather

# Per rank, its prompts: uneven counts and lengths, so ranks idle and extend at times.
PROMPTS = {0: [[1, 2, 3, 4, 5, 6, 7], [40, 41, 42]], 1: [[9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8]]}
MAX_TOKENS = (6, 9)
ROUNDS = 40  # enough for every request to finish; then all-idle rounds (no forward)


def rank_main(index: int, port: int, overlap: bool, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=index, world_size=2)
    gather_group = dist.new_group(backend="gloo")
    try:
        args = moe_args("tiny-moe", 2).replace(async_scheduling=overlap)
        runner = ModelRunner(args, rank=index, group=dist.group.WORLD)
        gather = TorchGather(gather_group)
        spans: dict[str, list[tuple[float, float]]] = {"gather": [], "forward": []}
        timed(gather, "all_gather", spans["gather"])
        timed(runner, "execute", spans["forward"])
        core = EngineCore(args, runner, rank=index, gather=gather)
        requests = [
            Request(f"r{index}-{i}", prompt, SamplingParams(max_tokens=MAX_TOKENS[i % 2]))
            for i, prompt in enumerate(PROMPTS[index])
        ]
        for request in requests:
            core.submit(request)
        for _ in range(ROUNDS):
            core.step()
        core.loop.close()
        tokens = {r.request_id: list(r.output_token_ids) for r in requests}
        Path(out, f"rank{index}.json").write_text(json.dumps({"tokens": tokens, **spans}))
    finally:
        dist.barrier()  # neither rank tears its groups down while the other still uses them
        dist.destroy_process_group(gather_group)
        dist.destroy_process_group()


def timed(owner: object, name: str, spans: list[tuple[float, float]]) -> None:
    """Record each call of ``owner.name`` as a ``(start, end)`` span (on any thread)."""
    method = getattr(owner, name)

    def wrapper(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spans.append((start, time.perf_counter()))

    setattr(owner, name, wrapper)


def overlapping(spans: dict[str, list[list[float]]]) -> int:
    """Gathers that ran while a forward was running."""
    return sum(
        any(f0 < g1 and g0 < f1 for f0, f1 in spans["forward"]) for g0, g1 in spans["gather"]
    )


def group_run(tmp_path: Path, overlap: bool) -> tuple[dict[str, list[int]], int]:
    """Every request's tokens, and how many of the ranks' gathers overlapped a forward."""
    out = tmp_path / ("on" if overlap else "off")
    out.mkdir()
    run_ranks(rank_main, (free_port(), overlap, str(out)), 2, f"overlap={overlap}")
    tokens: dict[str, list[int]] = {}
    overlapped = 0
    for rank in (0, 1):
        record = json.loads((out / f"rank{rank}.json").read_text())
        tokens |= record["tokens"]
        overlapped += overlapping(record)
    return tokens, overlapped


@pytest.mark.integration
def test_an_expert_parallel_group_overlaps_with_the_same_tokens(tmp_path: Path) -> None:
    (synchronous, none), (overlapped, some) = group_run(tmp_path, False), group_run(tmp_path, True)
    assert overlapped == synchronous
    assert none == 0 and some > 0  # the gathers did run beside the expert all-to-alls
    assert all(len(tokens) == MAX_TOKENS[int(rid[-1]) % 2] for rid, tokens in synchronous.items())
