"""DeepSeek's multi-token-prediction (next-n) layer, drafting on the rank (``mtp``).

DeepSeek-V3 checkpoints carry one block after their ``num_layers`` (``model.layers.61.*`` for
the 671B model) trained to predict the token after next. At position ``p`` it reads the main
model's normed last hidden state ``h_p`` and the embedding of the token at ``p + 1``::

    x_p     = eh_proj([enorm(embed(t[p+1])), hnorm(h_p)])     # concatenated, 2H -> H
    y_p     = block(x_p)                                      # a full decoder block, MoE too
    draft   = argmax(lm_head(norm_head(y_p)))                 # a guess at t[p+2]

It shares the main model's embedding and LM head (the checkpoint's copies under the layer,
``embed_tokens`` and ``shared_head.head``, are the same tensors and are not read) and has its
own final norm (``shared_head.norm``). The convention for ``h_p`` (after the main model's
final norm) is vLLM's and SGLang's.

**In the round.** The block attends over its own K/V, one more cache layer
(``ModelConfig.draft_layers``) on the same pages, so it runs over exactly the round's batch:
the same positions, page table and attention plan as the main forward (``NextNDrafter.hold``
keeps them), once sampling and verification have fixed every token that follows. For every
position of every chunk the next token is known then: the prompt's own next token inside a
prefill chunk; the sampled token after a prompt's last position or a plain decode; for a
verify chunk ``[t, d1..dd]`` with ``n`` drafts kept, ``d1..dn`` and then the sampled token
(positions past the first rejection get their drafts: their K/V slots are rolled back with
the main layers'). Each request's draft for the next round is read at the position of its
last kept token. So the next-n cache stays exact for every kept position, as the main
layers' does, and a request's drafts cost no forward of their own.

**One draft a round.** A second draft would need the block run again at positions whose
pages the next round has not reserved yet; ``speculative_config.num_speculative_tokens`` for
``mtp`` is therefore at most the checkpoint's next-n layers that run (DeepSeek-V3: 1), which
is what DeepSeek reports 85-90 % acceptance for.

**Lockstep.** The block's MoE is a collective of the group like every MoE layer: every rank
runs the draft pass in every round it runs a forward, and a rank with nothing to run joins
its collectives with an empty batch (``NextNDrafter.idle``), so every rank runs the same two
forwards a round whatever it holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from roundgate.actors.control.round import ScheduledChunk
from roundgate.actors.model.config import ModelConfig
from roundgate.actors.model.decoder import CausalLM, DecoderLayer, load_layer, move_to
from roundgate.actors.model.expert_rehome import rehome_experts
from roundgate.actors.model.layers import ForwardContext, RMSNorm, fill, linear
from roundgate.actors.model.moe import SparseMoE
from roundgate.actors.model.weights import TensorSource
from roundgate.kernels.moe.base import MoEBackend
from roundgate.kernels.moe.expert_map import ExpertMap
from roundgate.kernels.moe.placement import ExpertPlacement


class NextNLayer(nn.Module):
    """One next-n block: the projection of [next token's embedding, hidden state], a decoder
    block at cache layer ``num_layers``, and its own final norm."""

    def __init__(self, config: ModelConfig, placement: ExpertPlacement) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = RMSNorm(h, eps)
        self.hnorm = RMSNorm(h, eps)
        self.eh_proj = linear(2 * h, h, bias=False)
        # Its MoE (if any) keeps the static expert blocks: EPLB re-places the model's layers.
        self.block_index = config.num_layers  # its name in the checkpoint, its cache layer
        self.block = DecoderLayer(config, config.num_layers, placement, moe_index=-1)
        self.head_norm = RMSNorm(h, eps)
        self.placement = placement

    @property
    def layers(self) -> list[DecoderLayer]:
        """Its one block, as ``expert_rehome`` walks a model's layers."""
        return [self.block]

    def forward(
        self, hidden: torch.Tensor, next_embeds: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """Every position's normed output (``hidden``: the model's normed last hidden
        states; ``next_embeds``: the embeddings of the tokens one position later)."""
        x = self.eh_proj(torch.cat([self.enorm(next_embeds), self.hnorm(hidden)], dim=-1))
        return self.head_norm(self.block(x, ctx))

    def load(self, source: TensorSource, prefix: str) -> None:
        fill(self.enorm.weight, source, prefix + "enorm.weight")
        fill(self.hnorm.weight, source, prefix + "hnorm.weight")
        fill(self.eh_proj.weight, source, prefix + "eh_proj.weight")
        fill(self.head_norm.weight, source, prefix + "shared_head.norm.weight")
        load_layer(self.block, source, prefix)


def build_next_n(
    config: ModelConfig,
    source: TensorSource,
    placement: ExpertPlacement,
    dtype: torch.dtype,
    device: torch.device,
) -> NextNLayer:
    """The checkpoint's first next-n layer (``model.layers.{num_layers}.``), loaded and moved
    as ``build_model`` moves the model (routers kept float32)."""
    if config.num_nextn_predict_layers < 1:
        raise ValueError(f"{config.architecture}: the checkpoint has no next-n (MTP) layer")
    layer = NextNLayer(config, placement)
    layer.load(source, f"model.layers.{config.num_layers}.")
    move_to(layer, dtype, device)
    if isinstance(layer.block.mlp, SparseMoE):
        moe = layer.block.mlp
        moe.expert_map = ExpertMap(placement, moe.expert_map.physical_to_logical, device)
    return layer.eval()


def next_tokens(
    chunks: Sequence[ScheduledChunk],
    sampled: Mapping[str, int],
    accepted: Mapping[str, tuple[int, ...]],
) -> tuple[list[int], dict[str, int]]:
    """The token one position after every token of the round's flattened batch, and for
    each request that drafts next round the flattened row its draft is read at.

    A request that sampled nothing this round (a failed one, a prompt chunk short of its
    end) drafts nothing; positions whose next token is not known yet get token 0 (only a
    failed request's: their K/V never serves a kept position).
    """
    tokens: list[int] = []
    rows: dict[str, int] = {}
    offset = 0
    for req, start, num_tokens, is_prefill in chunks:
        rid = req.request_id
        token = sampled.get(rid)
        end = start + num_tokens
        if is_prefill:
            known = min(end + 1, req.num_tokens)
            tokens += req.token_ids(start + 1, known)
            if known < end + 1:  # the prompt's last position: the token it sampled
                tokens.append(0 if token is None else token)
                if token is not None:
                    rows[rid] = offset + num_tokens - 1
        else:
            kept = len(accepted.get(rid, ()))
            following = [*req.drafts, 0]
            if token is not None:
                following[kept] = token
                rows[rid] = offset + kept
            tokens += following
        offset += num_tokens
    return tokens, rows


class NextNDrafter:
    """The rank's ``mtp`` drafts: the next-n layer run over each round's batch after it is
    sampled (the module docstring)."""

    needs_hidden = True  # it reads the round's normed hidden states

    def __init__(self, layer: NextNLayer, model: CausalLM) -> None:
        self.layer = layer
        self.model = model
        self._held: tuple[ForwardContext, torch.Tensor] | None = None

    def hold(self, ctx: ForwardContext, hidden: torch.Tensor) -> None:
        """Keep the round's forward context and normed hidden states for ``draft``."""
        # Not counted for EPLB: the next-n layer keeps its static experts.
        self._held = (dataclasses.replace(ctx, expert_load=None), hidden)

    @torch.inference_mode()
    def draft(
        self,
        chunks: Sequence[ScheduledChunk],
        sampled: Mapping[str, int],
        accepted: Mapping[str, tuple[int, ...]],
    ) -> dict[str, tuple[int, ...]]:
        """Run the layer over the held round (writing its K/V); each drafting request's
        greedy guess at the token after the one it sampled."""
        rows, logits = self.draft_logits(chunks, sampled, accepted)
        guesses = logits.argmax(dim=-1).tolist() if rows else []
        return {rid: (guess,) for rid, guess in zip(rows, guesses, strict=True)}

    def draft_logits(
        self,
        chunks: Sequence[ScheduledChunk],
        sampled: Mapping[str, int],
        accepted: Mapping[str, tuple[int, ...]],
    ) -> tuple[dict[str, int], torch.Tensor]:
        """``draft``'s rows (request id -> flattened row) and the layer's logits there, in
        that order (``[len(rows), vocab]``)."""
        if self._held is None:
            raise RuntimeError("NextNDrafter.draft without a held forward")
        ctx, hidden = self._held
        self._held = None
        tokens, rows = next_tokens(chunks, sampled, accepted)
        ids = torch.tensor(tokens, dtype=torch.long, device=hidden.device)
        out = self.layer(hidden, self.model.embed_tokens(ids), ctx)
        at = torch.tensor(list(rows.values()), dtype=torch.long, device=hidden.device)
        return rows, self.model.lm_head(out.index_select(0, at)).float()

    def regroup(
        self, placement: ExpertPlacement, group: Any, source: Callable[[], TensorSource]
    ) -> None:
        """Re-home the layer's experts with the model's onto a re-formed group (elastic
        expert parallelism): every member calls this after the model's own re-homing."""
        rehome_experts(self.layer, placement, group, source, first_layer=self.layer.block_index)

    @torch.inference_mode()
    def idle(self, moe: MoEBackend | None, low_latency: bool) -> None:
        """Join the layer's MoE collectives with no tokens (a rank with nothing to run)."""
        self._held = None
        mlp = self.layer.block.mlp
        if isinstance(mlp, SparseMoE) and moe is not None and moe.needs_collectives:
            empty = self.model.embed_tokens.weight.new_zeros(0, self.layer.eh_proj.out_features)
            mlp.run(empty, moe, low_latency)
