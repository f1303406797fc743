"""The real executor: runs a ``RoundPlan`` through the model on this rank's paged KV cache.

One round, in order::

    park    retracted requests' pages -> host (before the scheduler reuses the pages)
    restore readmitted requests' host copy -> their new pages
    copy    cached pages into the pages of prompts that recompute only their last token
    forward every chunk as one flattened ragged batch (or an idle forward)
    score   the prompt positions of requests that asked for prompt logprobs (only those)
    sample  one token for every chunk whose ``samples`` is true

The runner never mutates requests: the scheduler applies the ``RoundResult``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from roundgate.actors.control.request import Request, TokenLogprobs, sequence_id
from roundgate.actors.control.round import RoundPlan, RoundResult, ScheduledChunk
from roundgate.actors.model.decode_graphs import DecodeGraphs, ineligibility
from roundgate.actors.model.decoder import build_model, open_source
from roundgate.actors.model.drafters import build_drafter
from roundgate.actors.model.expert_balance import EplbConfig, ExpertBalancer
from roundgate.actors.model.expert_rehome import RehomeReport, rehome_experts
from roundgate.actors.model.expert_world import group_world, placement_file
from roundgate.actors.model.fused_path import choose_fused_path, masked_experts_fit
from roundgate.actors.model.gguf_blocks import pack_gguf, weight_path
from roundgate.actors.model.grammar import Grammars
from roundgate.actors.model.kv_cache import allocate_cache, pages_for_gpu, select_backend
from roundgate.actors.model.layers import ForwardContext
from roundgate.actors.model.llamacpp_arith import fuse_layers, use_llamacpp_arithmetic
from roundgate.actors.model.prompt_logprobs import prompt_rows, score_rows
from roundgate.actors.model.round_sampling import sample_each
from roundgate.actors.model.runner_config import RunnerConfig, resolve_device
from roundgate.actors.model.spec_rounds import verify_round, verify_rows
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.server_args import ServerArgs
from roundgate.gate.rows import RankRow, RoundView, read_rows
from roundgate.kernels.attention.batch import AttentionBatch, build_attention_batch
from roundgate.kernels.moe.placement import ExpertPlacement
from roundgate.kernels.moe.registry import build_backend as select_moe_backend
from roundgate.kernels.moe.registry import experts_kernel as select_experts_kernel
from roundgate.kernels.moe.rehome import grown_layout
from roundgate.kernels.quant.ggml_arith import GgmlAttention

logger = logging.getLogger("roundgate.runner")


class DeferredGroup:
    """The ``group`` of a rank whose process group forms after its model loads (an elastic
    MoE rank: it loads its seat's shard of the experts, then enters its group, whose first
    epoch calls ``regroup_experts`` on every member)."""


class ModelRunner:
    """One rank's model shard, KV cache and sampler, behind the ``Executor`` protocol.

    ``runner_config`` is this rank's part of the engine's configuration (``RunnerConfig.of``
    a validated ``ServerArgs``); under ``gpu_memory_utilization`` it becomes a copy with
    ``num_kv_pages`` set from the memory left after the weights (the scheduler's pool must be
    given that count). ``group`` is the DP group's ``torch.distributed`` process group
    (``None``: the default group when ``dp_size > 1``). Attention is data-parallel: every rank
    holds all attention weights. Experts are sharded over the group (``ExpertPlacement``), so
    an MoE model with ``dp_size > 1`` needs every rank in every round (idle ranks run
    ``idle_forward``).
    """

    def __init__(
        self, runner_config: RunnerConfig | ServerArgs, rank: int = 0, group: Any = None
    ) -> None:
        # (A whole ServerArgs: the call before RunnerConfig, kept for its callers; ``args``.)
        self._server_args = runner_config if isinstance(runner_config, ServerArgs) else None
        if isinstance(runner_config, ServerArgs):
            runner_config = RunnerConfig.of(runner_config)
        self.rank = rank
        # The plan whose one-off steps ran (the closed round's rebalance, parking, restoring,
        # page copies): an elastic group that re-forms mid-forward runs the plan again.
        self._prepared: RoundPlan | None = None
        self._counted = False  # a forward counted expert load since the last end_round
        self.device = resolve_device(runner_config.device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.config = config = runner_config.model_config
        # An elastic MoE rank loads before its group forms: its seat's shard now, the MoE
        # backend and any re-homing at the group's first epoch (``regroup_experts``).
        deferred = isinstance(group, DeferredGroup)
        if deferred:
            world, group = (runner_config.dp_size if config.is_moe else 1), None
        else:
            world = group_world(runner_config.dp_size, rank, group) if config.is_moe else 1
        self.placement = ExpertPlacement(
            max(config.num_experts, 1),
            world,
            rank if world > 1 else 0,
            runner_config.num_redundant_experts if world > 1 else 0,
        )
        rc = runner_config
        source = open_source(rc.model, config, rc.seed, rc.fp8_weights, self.device)
        self.model = build_model(
            config,
            source,
            self.placement,
            self.dtype,
            self.device,
            expert_maps=placement_file(runner_config, self.placement),
        )
        # --enable-eplb: expert load counted each round, experts re-placed every interval.
        self.eplb = EplbConfig.of(runner_config, config.router.n_group)
        self.balancer = (
            ExpertBalancer(self.model, self.eplb, group, self.device)
            if runner_config.enable_eplb and world > 1 and not deferred
            else None
        )
        if runner_config.gguf_weights != "float" and self.device.type == "cpu":
            int8_dot = runner_config.gguf_weights == "int8-dot"
            pack_gguf(self.model, source, config.tie_word_embeddings, int8_dot)
        # What /metrics reports as this rank's weight path.
        self.weight_path = weight_path(self.model)
        share = runner_config.gpu_memory_utilization
        if share is not None:  # sized now that the weights are in
            pages = pages_for_gpu(share, runner_config.page_size, config, self.device)
            runner_config = runner_config.with_pages(pages)
        self.runner_config = runner_config
        self.attention = select_backend(
            runner_config.attention_backend, config, self.device, self.dtype
        )
        # int8-dot takes llama.cpp as its reference: its float operations too, where covered.
        llamacpp = (
            self.weight_path == "int8-dot"
            and self.attention.name == "torch"
            and use_llamacpp_arithmetic(self.model, config)
        )
        if llamacpp:
            self.attention = GgmlAttention()
        self.moe = (
            None
            if deferred
            else select_moe_backend(
                runner_config.moe_backend,
                self.placement,
                group=group,
                device=self.device,
                hidden_size=config.hidden_size,
                max_dispatch_tokens_per_rank=runner_config.max_batch_size,
            )
            if config.is_moe
            else None
        )
        self.experts = select_experts_kernel(runner_config.moe_kernel, self.device)
        self._fuse()
        # A draft model run after each round (``mtp``, ``draft_model``), or None.
        self.drafter = build_drafter(runner_config, self.model, source, self.placement)
        self.cache = allocate_cache(
            runner_config.num_kv_pages, runner_config.page_size, config, self.dtype, self.device
        )
        if self.attention.name in ("torch", "ggml"):  # packed CPU weights: layers in one call
            fuse_layers(self.model, config, self.cache)
        why_eager = ineligibility(
            self.device.type,
            runner_config.enforce_eager,
            config.is_moe,
            self.attention.name,
            moe_graph_safe=self.fused.moe_graph_safe(self.moe),
        )
        if why_eager is None and self.drafter is not None and self.drafter.needs_hidden:
            why_eager = "the next-n draft layer reads every round's hidden states"
        self.graphs = self.decode_graphs(capture=True) if why_eager is None else None
        if self.graphs is not None:  # every bucket now, on every rank: none mid-serving
            self.graphs.capture_all()
        if why_eager is not None and self.device.type == "cuda":
            logger.info("decode rounds run eagerly: %s", why_eager)
        # Unseeded sampling: one stream per rank, reproducible from --seed.
        self.generator = torch.Generator(device=self.device).manual_seed(runner_config.seed + rank)
        # request id -> host copy of its KV pages while it is retracted.
        self.parked: dict[str, torch.Tensor] = {}
        self.grammars = Grammars(
            runner_config.model,
            runner_config.chat_template,
            config.vocab_size,
            runner_config.max_grammar_cache,
        )

    @property
    def args(self) -> ServerArgs:
        """The ``ServerArgs`` this runner was built from, its ``num_kv_pages`` the pool sized
        here: for callers that still build an ``EngineCore`` from ``runner.args``
        (``actors/disaggregated.py``); a runner built from a ``RunnerConfig`` has none."""
        if self._server_args is None:
            raise AttributeError("a runner built from a RunnerConfig has no ServerArgs")
        pages = self.runner_config.num_kv_pages
        if pages != self._server_args.num_kv_pages:
            self._server_args = self._server_args.replace(
                num_kv_pages=pages, gpu_memory_utilization=None
            )
        return self._server_args

    # -- Executor ---------------------------------------------------------------------------

    def execute(
        self, plan: RoundPlan, rows: Sequence[RankRow] = (), view: RoundView | None = None
    ) -> RoundResult:
        """Run one round; the group's gather (``view``, else read from ``rows``; alone, the
        plan itself) chooses the MoE legs."""
        started = time.perf_counter()
        if self._prepared is not plan:  # once per plan: a round run again after a re-form
            if self.balancer is not None and self._counted:  # the last round's end
                self.balancer.end_round()  # every interval: a rebalance, on every rank
                self._counted = False
            self.park(plan.retracted)
            self.restore(plan.readmitted, plan.chunks)
            for source, target in plan.page_copies:  # a fully cached prompt's private page
                self.cache.write_pages([target], self.cache.read_pages([source]))
            self._prepared = plan
        if view is None:
            view = read_rows(rows) if rows else None
        low_latency = view.low_latency if view is not None else plan.num_extends == 0
        bucket = self.graphs.round_bucket(rows) if self.graphs is not None else None
        sampled: dict[str, int] = {}
        logprobs: dict[str, TokenLogprobs] = {}
        forks: dict[str, tuple[int, ...]] = {}
        # Requests that fail alone this round (a sampling failure): the scheduler fails them.
        # No limit is checked here: the rank's intake refused what could never fit, and the
        # scheduler never plans a position past the context (it finishes requests there).
        failed: dict[str, str] = {}
        prompt_logprobs: dict[str, list[TokenLogprobs]] = {}
        verdicts = None
        drafts: dict[str, tuple[int, ...]] = {}
        chunks = plan.chunks
        if chunks:
            # Prompt positions to score: looked for only in rounds that extend a prompt.
            found = prompt_rows(chunks) if plan.num_extends else None
            # Draft positions to verify: only under speculative decoding.
            drafted = verify_rows(chunks) if self.runner_config.speculative else None
            extra = (found.rows if found else []) + (drafted.rows if drafted else [])
            if extra:
                logits = self.forward(chunks, low_latency, extra)
            else:
                logits = self.forward(chunks, low_latency, bucket=bucket)
            scored = len(chunks) + (len(found.rows) if found else 0)
            if found is not None:
                prompt_logprobs = score_rows(logits[len(chunks) : scored], found)
            if drafted is not None:
                verdicts = verify_round(logits, scored, drafted, chunks, self.generator, failed)
            logits = logits[: len(chunks)]
            verifying = set(drafted.chunks) if drafted is not None else ()
            picks = [i for i, c in enumerate(chunks) if c.samples and i not in verifying]
            if picks:
                requests = [chunks[i].request for i in picks]
                sampled, logprobs, forks = sample_each(
                    logits[picks], requests, self.generator, self.grammars, failed
                )
                # A prefill rank hands the forks to its decode rank, which shares the pages.
                role = self.runner_config.disaggregation_mode
                if forks and role is not DisaggregationRole.PREFILL:
                    self.save_forks(requests, forks)
            if self.drafter is not None:  # next round's drafts, from what this one emitted
                emitted = {**sampled, **verdicts.sampled} if verdicts else sampled
                accepted = verdicts.accepted if verdicts else {}
                drafts = self.drafter.draft(chunks, emitted, accepted)
        else:
            self.idle_forward(low_latency, bucket)
        self._counted = True
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        cost = time.perf_counter() - started
        result = RoundResult(sampled, cost, logprobs, forks, failed, prompt_logprobs)
        result.drafts = drafts
        if verdicts is not None:
            verdicts.apply_to(result)
        return result

    # -- forward ----------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(
        self,
        work: RoundPlan | Sequence[ScheduledChunk],
        low_latency: bool | None = None,
        extra_rows: Sequence[int] | None = None,
        bucket: int | None = None,
    ) -> torch.Tensor:
        """Float32 logits at the last position of every chunk, ``[len(chunks), vocab]``,
        followed by those at ``extra_rows`` (flattened token indices: prompt logprobs).

        Writes the chunks' K/V into the cache, exactly as ``execute`` does.
        """
        chunks = work.chunks if isinstance(work, RoundPlan) else work
        if (
            self.graphs is not None
            and not extra_rows
            and chunks
            and all(c.num_tokens == 1 for c in chunks)
        ):
            logits = self.graphs.run(
                [c.token_ids[0] for c in chunks],
                [c.start for c in chunks],
                [c.request.page_ids for c in chunks],
                bucket,
            )
            if logits is not None:  # a copy: the bucket's buffer is rewritten next round
                return logits.to(torch.float32, copy=True)
        num_extends = sum(1 for c in chunks if c.is_prefill)
        token_ids: list[int] = []
        for c in chunks:
            token_ids += c.token_ids
        batch = build_attention_batch(
            [c.num_tokens for c in chunks],
            [c.start for c in chunks],
            [c.request.page_ids for c in chunks],
            self.runner_config.page_size,
            self.device,
        )
        input_ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        low_latency = num_extends == 0 if low_latency is None else low_latency
        return self.forward_batch(input_ids, batch, low_latency, extra_rows).float()

    def forward_batch(
        self,
        input_ids: torch.Tensor,
        batch: AttentionBatch,
        low_latency: bool = True,
        extra_rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Logits at the last row of every sequence of ``batch``, then at ``extra_rows``
        (tensor ops only: the decode graphs capture this, with no extra rows)."""
        cos, sin = self.model.rotary.lookup(batch.positions, self.dtype)
        ctx = ForwardContext(
            attention=self.attention,
            attention_state=self.attention.prepare(batch),
            batch=batch,
            cache=self.cache,
            moe=self.moe,
            low_latency=low_latency,
            cos=cos,
            sin=sin,
            experts=self.experts,
            expert_load=self.balancer.load if self.balancer is not None else None,
            fused=self.fused.kernels,
            fused_moe=self.fused.moe,
        )
        rows = batch.cu_query_lens[1:] - 1
        if extra_rows:
            extra = torch.tensor(extra_rows, dtype=rows.dtype, device=rows.device)
            rows = torch.cat([rows, extra])
        if self.drafter is not None and self.drafter.needs_hidden:
            logits, hidden = self.model.forward_hidden(input_ids, ctx, rows)
            self.drafter.hold(ctx, hidden)
            return logits
        return self.model(input_ids, ctx, rows)

    def _fuse(self) -> None:
        """Choose the fused decode path for the current MoE backend, whose low-latency legs
        first take the masked experts where they can (``fused_path``)."""
        if self.moe is not None and masked_experts_fit(self.experts, self.model, self.device):
            self.moe.take_masked_experts()
        counts_load = self.balancer is not None
        self.fused = choose_fused_path(
            self.attention.name, self.experts, self.moe, counts_load, self.model
        )

    def decode_graphs(self, capture: bool) -> DecodeGraphs:
        """Decode rounds on per-bucket static buffers (``capture``: as CUDA graphs; without,
        the same padded path runs eagerly, which is what a CPU can check)."""
        return DecodeGraphs(
            self.forward_batch,
            max_batch_size=self.runner_config.max_batch_size,
            max_pages=-(-self.runner_config.max_model_len // self.runner_config.page_size),
            page_size=self.runner_config.page_size,
            scratch_page=self.runner_config.num_kv_pages,
            device=self.device,
            capture=capture,
            shared_bucket=self.moe is not None and self.moe.needs_collectives,
        )

    @torch.inference_mode()
    def idle_forward(self, low_latency: bool = True, bucket: int | None = None) -> None:
        """Join the group's MoE collectives with an empty batch (a no-op when none exist), or
        replay the group's ``bucket`` with every row padding; the draft layer's too."""
        if bucket is not None and self.graphs is not None:
            self.graphs.run([], [], [], bucket)
        else:
            self.model.idle_forward(self.moe, low_latency)
        if self.drafter is not None:
            self.drafter.idle(self.moe, low_latency)

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
                pages = -(-request.num_prompt_tokens // self.runner_config.page_size)
                saved = self.cache.read_pages(request.page_ids[:pages])
                for j in range(1, len(firsts) + 1):
                    self.parked[sequence_id(request.request_id, j)] = saved

    def restore(self, readmitted: Sequence[Request], chunks: Sequence[ScheduledChunk] = ()) -> None:
        """Copy parked KV into each readmitted request's new pages. ``chunks``: the round's,
        whose tokens a readmitted request already counts as computed (a readmitted decode
        plans its next token in the same round) but whose KV this round's forward writes."""
        if not readmitted:  # most rounds: no pass over the round's chunks
            return
        planned: dict[str, int] = {}
        for chunk in chunks:
            rid = chunk.request.request_id
            planned[rid] = planned.get(rid, 0) + chunk.num_tokens
        page_size = self.runner_config.page_size
        for request in readmitted:
            saved = self.parked.pop(request.request_id, None)
            cached = request.num_computed_tokens - planned.get(request.request_id, 0)
            needed = -(-cached // page_size)
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
                    f"pages, needs {needed} for {cached} cached tokens"
                )
            self.cache.write_pages(request.page_ids[:count], saved[:, :, :count])

    def regroup_experts(self, rank: int, world_size: int, group: Any = None) -> RehomeReport:
        """Re-home the experts onto a re-formed group (elastic expert parallelism): every
        member of the new epoch calls this, on its engine thread, before the epoch's first
        round (``group``: the epoch's process group; None for the default group).

        Each member keeps the configured slots per rank where the group's slots still hold
        every logical expert, else grows to the fewest that do (``grown_layout``); the
        experts are placed for the new group and filled from members' copies, or from the
        model's files where no copy survived (``expert_rehome``). The MoE backend is rebuilt
        on the new group, and EPLB starts a new window on the new placement.
        """
        config, rc = self.config, self.runner_config
        if not config.is_moe:
            raise ValueError(f"{rc.model} is dense: it has no experts to re-home")
        configured = ExpertPlacement(
            config.num_experts, rc.dp_size, 0, rc.num_redundant_experts if rc.dp_size > 1 else 0
        ).num_local_experts
        layout = grown_layout(config.num_experts, configured, world_size)
        placement = ExpertPlacement(
            config.num_experts, world_size, rank, layout.num_physical - layout.num_logical
        )
        self._counted = False  # the old window ends with the old placement
        source = lambda: open_source(rc.model, config, rc.seed, rc.fp8_weights, self.device)  # noqa: E731
        report = rehome_experts(self.model, placement, group, source)
        if self.drafter is not None:  # a next-n layer's experts move with the model's
            self.drafter.regroup(placement, group, source)
        self.placement = placement
        self.moe = select_moe_backend(
            rc.moe_backend if world_size > 1 else "auto",
            placement,
            group=group,
            device=self.device,
            hidden_size=config.hidden_size,
            max_dispatch_tokens_per_rank=rc.max_batch_size,
        )
        if rc.enable_eplb:
            self.balancer = (
                ExpertBalancer(self.model, self.eplb, group, self.device)
                if world_size > 1
                else None
            )
        self._fuse()
        return report

    def drop_parked(self, request_id: str) -> None:
        """Forget a retracted request's host KV (it was aborted while parked)."""
        self.parked.pop(request_id, None)
