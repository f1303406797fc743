"""Elastic expert parallelism at the runner: a MoE group loses a rank, serves on alone, and
takes a replacement back, over real gloo groups, with real expert weights.

Three processes: a survivor, a victim and a joiner. The survivor and the victim serve 4
requests each at dp=2 with experts sharded; the victim leaves (its process ends); the survivor
forms a group of one, re-homes the experts (``ModelRunner.regroup_experts``) and decodes on;
then the joiner builds its runner (its seat's shard from the files), the two form a group of
two, re-home again, and decode the survivor's requests and 4 new ones on the joiner. Checked:
every request's greedy tokens equal transformers' (no token lost or changed across either
re-form); the DeepSeek-V3 group runs its next-n (MTP) draft layer too, whose experts re-home
with the model's, and every draft it makes, before and after each re-form, equals the
cache-free reference's (``mtp_models``); with no redundant experts the lone survivor reads
the lost experts from the files; with every expert held twice (``num_redundant_experts`` =
the expert count) it reads none.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from family_models import build_family
from model_driver import grow_pages, next_chunk
from mtp_models import reference_next_n_logits, save_deepseek_with_next_n
from test_expert_parallel import free_port, hf_greedy, run_ranks

from roundgate.actors.control.config import PoolConfig
from roundgate.actors.control.kv_pool import KVPool
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.round import RoundPlan
from roundgate.actors.model.runner import ModelRunner
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.rows import RankRow

PROMPTS = [[(5 * i + 2 * j) % 200 + 3 for j in range(3 + i)] for i in range(12)]
SURVIVOR, VICTIM, JOINER = range(3)
MINE = {SURVIVOR: [0, 1, 2, 3], VICTIM: [4, 5, 6, 7], JOINER: [8, 9, 10, 11]}
TOGETHER, ALONE, REJOINED = 4, 4, 10  # rounds in each phase
NEW_TOKENS = TOGETHER + ALONE + REJOINED


class Server:
    """One rank's requests and KV pool, driven round by round."""

    def __init__(self, runner: ModelRunner, ids: list[int]) -> None:
        self.runner = runner
        self.pool = KVPool(PoolConfig(256, 4))
        self.requests = {
            i: Request(f"r{i}", PROMPTS[i], SamplingParams(max_tokens=NEW_TOKENS)) for i in ids
        }
        self.drafts: list[tuple[str, int, int]] = []  # (request id, position, next-n draft)

    def live(self) -> list[Request]:
        return [r for r in self.requests.values() if len(r.output_token_ids) < NEW_TOKENS]

    def row(self) -> RankRow:
        live = self.live()
        extends = sum(r.num_computed_tokens < r.num_prompt_tokens for r in live)
        return RankRow(len(live), len(live), extends, False, bool(live))

    def round(self, rows: list[RankRow]) -> None:
        chunks = [next_chunk(r, chunk_size=1 << 30) for r in self.live()]
        for chunk in chunks:
            grow_pages(self.pool, chunk.request, chunk.end)
        result = self.runner.execute(RoundPlan(chunks=chunks), rows)
        assert not result.failed
        for chunk in chunks:
            req = chunk.request
            req.num_computed_tokens = chunk.end
            req.append_token(result.sampled[req.request_id])
            if req.request_id in result.drafts:  # drafted at the position before its token
                self.drafts.append(
                    (req.request_id, req.num_tokens - 2, result.drafts[req.request_id][0])
                )

    def tokens(self) -> dict[int, list[int]]:
        return {i: list(r.output_token_ids) for i, r in self.requests.items()}


def gathered(servers_rows: list[RankRow]) -> list[RankRow]:
    """Every member's row, as the group's gather would give them (all_gather_object)."""
    rows: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, servers_rows[0])
    return rows  # type: ignore[return-value]


def _join(port: int, rank: int, world: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )


def _main(
    index: int, model: str, ports: list[int], out_dir: str, redundant: int, mtp: bool
) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    args = ServerArgs(
        model=model,
        dp_size=2,
        moe_backend="torch",
        page_size=4,
        num_kv_pages=256,
        num_redundant_experts=redundant,
        enable_eplb=redundant > 0,  # redundant slots need a placement that uses them
        speculative_config={"method": "mtp", "num_speculative_tokens": 1} if mtp else None,
    )
    out: dict[str, object] = {}
    if index in (SURVIVOR, VICTIM):
        _join(ports[0], index, 2)
        server = Server(ModelRunner(args, rank=index), MINE[index])
        for _ in range(TOGETHER):
            server.round(gathered([server.row()]))
        dist.destroy_process_group()
        if index == VICTIM:  # gone: its requests would resume elsewhere (the replica's job)
            return
        _join(ports[1], 0, 1)  # the survivor alone
        out["alone"] = server.runner.regroup_experts(0, 1)
        for _ in range(ALONE):
            server.round([server.row()])
        dist.destroy_process_group()
        _join(ports[2], 0, 2)  # the joiner comes in
        out["rejoined"] = server.runner.regroup_experts(0, 2)
    else:
        _join(ports[2], 1, 2)  # waits for the survivor's second re-form
        server = Server(ModelRunner(args, rank=1), MINE[JOINER])
        out["rejoined"] = server.runner.regroup_experts(1, 2)
    for _ in range(REJOINED):
        server.round(gathered([server.row()]))
    out["tokens"] = server.tokens()
    out["drafts"] = server.drafts
    out["moe_layers"] = len(server.runner.model.moe_layers())
    torch.save(out, Path(out_dir) / f"p{index}.pt")
    dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.parametrize(("family", "redundant"), [("deepseek_v3", 0), ("qwen3_moe", 4)])
def test_a_group_loses_a_rank_serves_alone_and_regains_full_size(
    tmp_path: Path, family: str, redundant: int
) -> None:
    mtp = family == "deepseek_v3"
    if mtp:
        parts = save_deepseek_with_next_n(tmp_path / family)
        model = parts["main"]
    else:
        model = build_family(family)
        model.save_pretrained(tmp_path / family)
    ports = [free_port() for _ in range(3)]
    args = (str(tmp_path / family), ports, str(tmp_path), redundant, mtp)
    run_ranks(_main, args, 3, "elastic EP")
    survivor = torch.load(tmp_path / "p0.pt", weights_only=False)
    joiner = torch.load(tmp_path / "p2.pt", weights_only=False)
    # Every request served across the re-forms equals transformers' greedy decode.
    for tokens in (survivor["tokens"], joiner["tokens"]):
        for i, got in tokens.items():
            want = hf_greedy(model, PROMPTS[i], NEW_TOKENS)[: len(got)]
            assert got == want, f"request {i} differs from transformers"
    assert len(survivor["tokens"][0]) == NEW_TOKENS
    if mtp:  # the next-n layer drafts as the reference does, across both re-forms
        for out in (survivor, joiner):
            assert len(out["drafts"]) >= len(out["tokens"]) * REJOINED
            reference = {
                i: reference_next_n_logits(parts, PROMPTS[i] + tokens).argmax(-1)
                for i, tokens in out["tokens"].items()
            }
            for rid, position, draft in out["drafts"]:
                assert draft == int(reference[int(rid[1:])][position]), (rid, position)
    alone, rejoined = survivor["alone"], survivor["rejoined"]
    assert alone.world_size == 1 and rejoined.world_size == 2
    theirs = joiner["rejoined"]
    assert (rejoined.experts_transferred, rejoined.experts_loaded) == (
        theirs.experts_transferred,
        theirs.experts_loaded,
    ), "the members disagree on the re-home"
    if redundant:
        assert alone.experts_loaded == 0, "every expert had a surviving copy: none from files"
    else:
        # The victim held half of each layer's experts, one copy each: the survivor reads them.
        experts = model.config.n_routed_experts
        assert alone.experts_loaded == experts // 2 * survivor["moe_layers"]
