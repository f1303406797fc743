"""The real executor: runs a ``RoundPlan`` through the model on this rank's paged KV cache.

One round, in order::

    park    retracted requests' pages -> host (before the scheduler reuses the pages)
    restore readmitted requests' host copy -> their new pages
    forward every chunk as one flattened ragged batch (or an idle forward)
    sample  one token for every chunk whose ``samples`` is true

The runner never mutates requests: the scheduler applies the ``RoundResult``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from actors.control.request import Request, TokenLogprobs, sequence_id
from actors.control.round import RoundPlan, RoundResult
from actors.model.grammar import Grammars
from actors.model.layers import ForwardContext
from actors.model.llama import build_model
from actors.model.round_sampling import sample_round
from actors.model.weights import open_source
from actors.server_args import ServerArgs
from gate import RankRow, RoundView, read_rows
from kernels.attention import PagedKVCache, build_attention_batch, select_attention_backend
from kernels.moe import ExpertPlacement, select_moe_backend


def resolve_device(name: str) -> torch.device:
    """``--device``: ``auto`` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return torch.device(name)


class ModelRunner:
    """One rank's model shard, KV cache and sampler, behind the ``Executor`` protocol.

    ``group`` is the DP group's ``torch.distributed`` process group (``None``: the default
    group when ``dp_size > 1``). Attention is data-parallel: every rank holds all attention
    weights. Experts are sharded over the group (``ExpertPlacement``), so an MoE model
    with ``dp_size > 1`` needs every rank in every round (idle ranks run ``idle_forward``).
    """

    def __init__(self, args: ServerArgs, rank: int = 0, group: Any = None) -> None:
        self.args = args
        self.rank = rank
        self.device = resolve_device(args.device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.config = config = args.model_config  # read once, when the args were built
        self.max_model_len = args.max_model_len  # resolved against the model by ServerArgs
        world = _group_world(args.dp_size, rank, group) if config.is_moe else 1
        self.placement = ExpertPlacement(
            max(config.num_experts, 1), world, rank if world > 1 else 0
        )
        self.model = build_model(
            config,
            open_source(args.model, config, args.seed),
            self.placement,
            self.dtype,
            self.device,
        )
        self.attention = select_attention_backend(
            args.attention_backend,
            self.device,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            dtype=self.dtype,
        )
        self.moe = (
            select_moe_backend(
                args.moe_backend,
                self.placement,
                group=group,
                device=self.device,
                hidden_size=config.hidden_size,
                max_dispatch_tokens_per_rank=args.max_batch_size,
            )
            if config.is_moe
            else None
        )
        self.cache = PagedKVCache.allocate(
            config.num_layers,
            args.num_kv_pages,
            args.page_size,
            config.num_kv_heads,
            config.head_dim,
            self.dtype,
            self.device,
        )
        # Unseeded sampling: one stream per rank, reproducible from --seed.
        self.generator = torch.Generator(device=self.device).manual_seed(args.seed + rank)
        # request id -> host copy of its KV pages while it is retracted.
        self.parked: dict[str, torch.Tensor] = {}
        self.grammars = Grammars(args.model, args.chat_template, config.vocab_size)

    # -- Executor ---------------------------------------------------------------------------

    def execute(
        self, plan: RoundPlan, rows: Sequence[RankRow] = (), view: RoundView | None = None
    ) -> RoundResult:
        """Run one round; the group's gather (``view``, else read from ``rows``; alone, the
        plan itself) chooses the MoE legs."""
        started = time.perf_counter()
        self.park(plan.retracted)
        self.restore(plan.readmitted)
        if view is None:
            view = read_rows(rows) if rows else None
        low_latency = view.low_latency if view is not None else plan.num_extends == 0
        sampled: dict[str, int] = {}
        logprobs: dict[str, TokenLogprobs] = {}
        forks: dict[str, tuple[int, ...]] = {}
        if plan.chunks:
            logits = self.forward(plan, low_latency)
            picks = [i for i, c in enumerate(plan.chunks) if c.samples]
            if picks:
                requests = [plan.chunks[i].request for i in picks]
                sampled, logprobs, forks = sample_round(
                    logits[picks], requests, self.generator, self.grammars
                )
                if forks:
                    self.save_forks(requests, forks)
        else:
            self.idle_forward(low_latency)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return RoundResult(sampled, time.perf_counter() - started, logprobs, forks)

    # -- forward ----------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, plan: RoundPlan, low_latency: bool | None = None) -> torch.Tensor:
        """Float32 logits at the last position of every chunk, ``[len(plan.chunks), vocab]``.

        Writes the chunks' K/V into the cache, exactly as ``execute`` does.
        """
        chunks = plan.chunks
        too_long = [c for c in chunks if c.end > self.max_model_len]
        if too_long:
            c = too_long[0]
            raise ValueError(
                f"request {c.request.request_id}: position {c.end} exceeds the context "
                f"length {self.max_model_len}"
            )
        token_ids: list[int] = []
        for c in chunks:
            token_ids += c.token_ids
        batch = build_attention_batch(
            [c.num_tokens for c in chunks],
            [c.start for c in chunks],
            [c.request.page_ids for c in chunks],
            self.args.page_size,
            self.device,
        )
        cos, sin = self.model.rotary.lookup(batch.positions, self.dtype)
        ctx = ForwardContext(
            attention=self.attention,
            attention_state=self.attention.prepare(batch),
            batch=batch,
            cache=self.cache,
            moe=self.moe,
            low_latency=plan.num_extends == 0 if low_latency is None else low_latency,
            cos=cos,
            sin=sin,
        )
        input_ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        logits = self.model(input_ids, ctx, batch.cu_query_lens[1:] - 1)
        return logits.float()

    @torch.inference_mode()
    def idle_forward(self, low_latency: bool = True) -> None:
        """Join the group's MoE collectives with an empty batch (a no-op when none exist)."""
        self.model.idle_forward(self.moe, low_latency)

    # -- retraction -------------------------------------------------------------------------

    def park(self, retracted: Sequence[tuple[Request, list[int]]]) -> None:
        """Copy each retracted request's pages (its old page ids) to host memory."""
        for request, old_page_ids in retracted:
            if old_page_ids:
                self.parked[request.request_id] = self.cache.read_pages(old_page_ids)

    def check_request(self, request: Request) -> None:
        """Refuse, at submit, what this executor could not run (a grammar that won't compile)."""
        if request.sampling.grammar is not None:
            self.grammars.compile(request.sampling.grammar)

    def save_forks(self, requests: Sequence[Request], forks: dict[str, tuple[int, ...]]) -> None:
        """Keep a copy of each forking request's prompt KV for its new sequences, which the
        scheduler brings in as readmissions (``restore`` writes the copy into their pages)."""
        for request in requests:
            firsts = forks.get(request.request_id)
            if firsts:
                pages = -(-request.num_prompt_tokens // self.args.page_size)
                saved = self.cache.read_pages(request.page_ids[:pages])
                for j in range(1, len(firsts) + 1):
                    self.parked[sequence_id(request.request_id, j)] = saved

    def restore(self, readmitted: Sequence[Request]) -> None:
        """Copy parked KV into each readmitted request's new pages."""
        for request in readmitted:
            saved = self.parked.pop(request.request_id, None)
            needed = -(-request.num_computed_tokens // self.args.page_size)
            if saved is None:
                if needed:
                    raise ValueError(
                        f"request {request.request_id} readmitted without parked KV "
                        "(it was never retracted on this rank)"
                    )
                continue
            count = min(saved.shape[2], len(request.page_ids))
            if count < needed:
                raise ValueError(
                    f"request {request.request_id} readmitted into {len(request.page_ids)} "
                    f"pages, needs {needed} for {request.num_computed_tokens} cached tokens"
                )
            self.cache.write_pages(request.page_ids[:count], saved[:, :, :count])

    def drop_parked(self, request_id: str) -> None:
        """Forget a retracted request's host KV (it was aborted while parked)."""
        self.parked.pop(request_id, None)


def _group_world(dp_size: int, rank: int, group: Any) -> int:
    """The expert-parallel world: ``dp_size``, checked against the process group."""
    if dp_size == 1:
        return 1
    if not dist.is_initialized():
        raise ValueError(
            f"--dp-size {dp_size} with an MoE model needs torch.distributed initialised "
            "(the DP group's process group)"
        )
    world, group_rank = dist.get_world_size(group), dist.get_rank(group)
    if world != dp_size or group_rank != rank:
        raise ValueError(
            f"process group has rank {group_rank} of {world}, but the runner was built as "
            f"rank {rank} of --dp-size {dp_size}"
        )
    return world
