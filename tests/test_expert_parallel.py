"""Expert-parallel forward over 2 gloo ranks equals the single-process forward.

Models: the tiny-moe preset, and tiny random Qwen3-MoE (a sparse layer between dense ones)
and DeepSeek-V3 (MLA, a dense first layer, grouped sigmoid routing, a shared expert kept on
every rank) directories built with transformers. Two processes each hold half of the
experts and their own requests; every MoE layer is an all-to-all between them.
Rounds where one rank has nothing to run check the idle forward: that rank joins the
collectives with zero tokens and the group does not hang. One more run puts the ranks on
the Triton kernels (fused experts between the all-to-all legs, Triton attention; under
Triton's interpreter on CPU) against the single-process torch forward.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from family_models import build_family
from model_driver import grow_pages, next_chunk

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.request import Request
from roundgate.actors.control.round import RoundPlan
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.rows import RankRow, read_rows
from roundgate.kernels.triton_env import interpreter_enabled

PROMPTS = {"a": [1, 2, 3, 4, 5, 6, 7], "b": [40, 41, 42], "c": [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11]}
HOME = {"a": 0, "b": 0, "c": 1}  # which rank serves each request
# Per round, the requests each rank runs (prefill first time, then one decode a round).
ROUNDS = [
    {0: ["a", "b"], 1: ["c"]},  # both ranks extend: normal legs
    {0: ["a", "b"], 1: []},  # rank 1 idle
    {0: [], 1: ["c"]},  # rank 0 idle
    {0: ["a"], 1: ["c"]},  # both decode
]
TIMEOUT_S = 180  # a safety net against a hung collective; a normal run takes ~10 s


def gathered_rows(round_index: int) -> list[RankRow]:
    """The rows every rank would gather in a round: a request extends in its first round."""
    first = {n: min(i for i, r in enumerate(ROUNDS) if n in r[HOME[n]]) for n in PROMPTS}
    rows = []
    for names in ROUNDS[round_index].values():
        extends = sum(first[n] == round_index for n in names)
        rows.append(RankRow(len(names), len(names), extends, False, bool(names)))
    return rows


def moe_args(model: str, dp_size: int, kernels: str = "torch") -> ServerArgs:
    backend = "torch" if dp_size > 1 else "local"
    triton = {"attention_backend": "triton", "moe_kernel": "triton"} if kernels == "triton" else {}
    return ServerArgs(
        model=model, dp_size=dp_size, moe_backend=backend, page_size=4, num_kv_pages=64, **triton
    )


def run_rounds(runner: ModelRunner, rank: int | None) -> dict[str, list[torch.Tensor]]:
    """Play ROUNDS on one rank (``None``: every request, single process); logits per step."""
    pool = KVPool(PoolConfig(64, 4))
    requests = {name: Request(name, prompt) for name, prompt in PROMPTS.items()}
    logits: dict[str, list[torch.Tensor]] = {name: [] for name in PROMPTS}
    for round_index, plan_names in enumerate(ROUNDS):
        mine = plan_names[rank] if rank is not None else plan_names[0] + plan_names[1]
        chunks = [next_chunk(requests[name], chunk_size=1 << 30) for name in mine]
        for chunk in chunks:
            grow_pages(pool, chunk.request, chunk.end)
        plan = RoundPlan(chunks=chunks)
        rows = gathered_rows(round_index)
        if not chunks:
            result = runner.execute(plan, rows)  # the idle forward
            assert result.sampled == {}
            continue
        out = runner.forward(plan, low_latency=read_rows(rows).low_latency)
        for i, chunk in enumerate(chunks):
            logits[chunk.request.request_id].append(out[i])
            chunk.request.num_computed_tokens = chunk.end
            chunk.request.append_token(int(out[i].argmax()))
    return logits


def _rank_main(rank: int, model: str, port: int, out_dir: str, kernels: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # keep every socket on 127.0.0.1
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        runner = ModelRunner(moe_args(model, 2, kernels), rank=rank)
        half = runner.config.num_experts // 2
        assert list(runner.placement.local_experts) == list(range(rank * half, (rank + 1) * half))
        torch.save(run_rounds(runner, rank), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def assert_rank_matches(
    got: dict[str, list[torch.Tensor]],
    expected: dict[str, list[torch.Tensor]],
    rank: int,
    homes: dict[str, int],
) -> None:
    """A rank's logits per request equal one process's: its own requests' every round, and
    nothing for the requests homed (``homes``) on its peer."""
    for name, home in homes.items():
        if home != rank:
            assert got[name] == []
            continue
        assert len(got[name]) == len(expected[name]) > 1
        torch.testing.assert_close(
            torch.stack(got[name]), torch.stack(expected[name]), atol=1e-5, rtol=1e-5
        )


def run_ranks(main: Any, args: tuple[Any, ...], nprocs: int, what: str) -> None:
    """Spawn ``nprocs`` processes of ``main(index, *args)`` and wait for all of them; past
    ``TIMEOUT_S`` kill them and fail naming ``what`` (a hung collective would wait forever).
    ``join`` is True once all have ended (False: one of them did, or the second passed)."""
    context = mp.start_processes(main, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{what} did not finish in {TIMEOUT_S}s (deadlock?)")


def hf_greedy(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' own greedy continuation of ``prompt``: the reference token ids."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("model", "kernels"),
    [
        ("tiny-moe", "torch"),
        ("qwen3_moe", "torch"),
        ("deepseek_v3", "torch"),
        pytest.param("tiny-moe", "triton", marks=pytest.mark.triton),
    ],
)
def test_two_gloo_ranks_equal_one_process(tmp_path: Path, model: str, kernels: str) -> None:
    if kernels == "triton" and not (interpreter_enabled() or torch.cuda.is_available()):
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
    if model != "tiny-moe":
        build_family(model).save_pretrained(tmp_path / model)
        model = str(tmp_path / model)
    run_ranks(_rank_main, (model, free_port(), str(tmp_path), kernels), 2, "expert-parallel ranks")

    expected = run_rounds(ModelRunner(moe_args(model, 1)), rank=None)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert_rank_matches(got, expected, rank, HOME)
