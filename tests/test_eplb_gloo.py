"""EPLB live on 2 gloo ranks: skewed routing, rebalances between rounds, outputs unchanged.

Models: tiny random DeepSeek-V3 (MLA, grouped sigmoid routing; its
``e_score_correction_bias`` pushed so every token picks experts 2 and 4, on rank 0 in the
first placement) and Qwen3-MoE (its router rows made to pick experts 0 and 1, both on rank 0),
built with transformers' own classes. Each rank serves 4 of 8 concurrent requests (rank 1
starts two rounds late: idle forwards meet rebalances too) and a rebalance runs every 4
rounds. Checked: greedy tokens with EPLB equal the static placement's and transformers' for
every request; the window measured after the first rebalance is more balanced than the one
before it; weights really moved between the ranks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from family_models import build_family
from model_driver import grow_pages, next_chunk
from test_expert_parallel import free_port, hf_greedy, run_ranks

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.round import RoundPlan
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.rows import RankRow

PROMPTS = [[(7 * i + 3 * j) % 250 + 1 for j in range(3 + i)] for i in range(8)]
HOME = [0, 1, 0, 1, 0, 1, 0, 1]
START = {0: 0, 1: 2}  # the round each rank's requests arrive in
NEW_TOKENS = 14
NUM_ROUNDS = START[1] + NEW_TOKENS
INTERVAL = 4


def skewed(name: str) -> torch.nn.Module:
    """The family's tiny model, its routing pushed onto the experts of rank 0."""
    model = build_family(name)
    with torch.no_grad():
        if name == "deepseek_v3":
            for layer in model.model.layers[1:]:
                bias = layer.mlp.gate.e_score_correction_bias
                # Experts 2 and 4 (groups 1, 2) win every token's choice; with 2 redundant
                # slots the first placement copies experts 0 and 1 and leaves 2 and 4 on rank 0.
                bias[[2, 4]] += 8.0
        else:
            # A constant first hidden coordinate (every embedding) read strongly by the
            # router rows of experts 0 and 1: their logits dominate for every token.
            model.model.embed_tokens.weight[:, 0] = 3.0
            for layer in model.model.layers:
                if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts"):
                    layer.mlp.gate.weight[:2, 0] = 20.0
    return model


def rows_of(round_index: int) -> list[RankRow]:
    rows = []
    for rank in (0, 1):
        busy = round_index >= START[rank]
        n = HOME.count(rank) if busy else 0
        extends = n if round_index == START[rank] else 0
        rows.append(RankRow(n, n, extends, False, busy))
    return rows


def play(runner: ModelRunner, rank: int) -> tuple[dict[int, list[int]], list[tuple]]:
    """Serve this rank's requests for NUM_ROUNDS rounds; tokens per request, and each
    rebalance's (measured balancedness per layer, experts moved)."""
    pool = KVPool(PoolConfig(128, 4))
    mine = [i for i, home in enumerate(HOME) if home == rank]
    requests = {
        i: Request(f"r{i}", PROMPTS[i], SamplingParams(max_tokens=NEW_TOKENS)) for i in mine
    }
    reports = []
    for round_index in range(NUM_ROUNDS):
        chunks = []
        if round_index >= START[rank]:
            chunks = [next_chunk(requests[i], chunk_size=1 << 30) for i in mine]
            for chunk in chunks:
                grow_pages(pool, chunk.request, chunk.end)
        before = runner.balancer.rebalances if runner.balancer else 0
        result = runner.execute(RoundPlan(chunks=chunks), rows_of(round_index))
        assert not result.failed
        for chunk in chunks:
            chunk.request.num_computed_tokens = chunk.end
            chunk.request.append_token(result.sampled[chunk.request.request_id])
        if runner.balancer and runner.balancer.rebalances > before:
            last = runner.balancer.last
            reports.append((last.balancedness, last.experts_moved, last.predicted))
    return {i: r.output_token_ids[:NEW_TOKENS] for i, r in requests.items()}, reports


def _rank_main(rank: int, model: str, port: int, out_dir: str, redundant: int) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out = {}
        for mode in ("eplb", "static"):
            eplb = mode == "eplb"
            args = ServerArgs(
                model=model,
                dp_size=2,
                moe_backend="torch",
                page_size=4,
                num_kv_pages=128,
                enable_eplb=eplb,
                num_redundant_experts=redundant if eplb else 0,
                eplb_window_rounds=INTERVAL,
                eplb_interval_rounds=INTERVAL,
            )
            out[mode] = play(ModelRunner(args, rank=rank), rank)
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.parametrize(("family", "redundant"), [("deepseek_v3", 2), ("qwen3_moe", 0)])
def test_rebalance_live_keeps_outputs_and_evens_load(
    tmp_path: Path, family: str, redundant: int
) -> None:
    model = skewed(family)
    model.save_pretrained(tmp_path / family)
    run_ranks(
        _rank_main, (str(tmp_path / family), free_port(), str(tmp_path), redundant), 2, "EPLB ranks"
    )
    results = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    for rank, got in enumerate(results):
        eplb_tokens, reports = got["eplb"]
        static_tokens, static_reports = got["static"]
        assert static_reports == []
        assert eplb_tokens == static_tokens, f"rank {rank}: EPLB changed greedy output"
        for i, tokens in eplb_tokens.items():
            assert tokens == hf_greedy(model, PROMPTS[i], NEW_TOKENS), (
                f"request {i} differs from HF"
            )
        # A rebalance every INTERVAL rounds (at the start of the round after), identical on
        # both ranks.
        assert len(reports) == (NUM_ROUNDS - 1) // INTERVAL
        assert reports == results[0]["eplb"][1]
    reports = results[0]["eplb"][1]
    first, second = reports[0], reports[1]
    assert first[1] > 0, "the first rebalance moved no expert between ranks"
    for layer, (before, after) in enumerate(zip(first[0], second[0], strict=True)):
        assert before < 0.75, f"layer {layer}: routing was meant to be skewed ({before})"
        assert after > before + 0.15, f"layer {layer}: balancedness {before} -> {after}"
