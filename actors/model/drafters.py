"""The draft models a rank may run after each round, behind one small interface.

``speculative_config`` picks the source of a request's drafts. Prompt lookup (``ngram``)
needs no model and runs in the planner (``roundgate.actors.control.speculation``); the two
methods that need a forward run here, on the rank, once the round's tokens are sampled and
verified, and hand each request its drafts for the next round (``RoundResult.drafts``):

- ``mtp``: the checkpoint's next-n layer over the round's own batch
  (``roundgate.actors.model.mtp``);
- ``draft_model``: a small model of the same tokenizer (``roundgate.actors.model.draft_model``).

Drafts are only proposals: verification keeps exactly what the target would have emitted, so
no drafter can change an output, only how many rounds it takes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from roundgate.actors.control.round import ScheduledChunk
from roundgate.actors.model.decoder import CausalLM
from roundgate.actors.model.draft_model import DraftModel
from roundgate.actors.model.layers import ForwardContext
from roundgate.actors.model.mtp import NextNDrafter, build_next_n
from roundgate.actors.model.runner_config import RunnerConfig
from roundgate.actors.model.weights import TensorSource
from roundgate.kernels.moe.base import MoEBackend
from roundgate.kernels.moe.placement import ExpertPlacement

logger = logging.getLogger("roundgate.runner")

# History tokens one round's draft-model call runs at most, over all its requests.
DRAFT_CATCH_UP_TOKENS = 256


class Drafter(Protocol):
    """What the runner asks of a draft model each round."""

    # Whether ``hold`` wants the round's forward context and normed hidden states.
    needs_hidden: bool

    def hold(self, ctx: ForwardContext, hidden: torch.Tensor) -> None: ...

    def draft(
        self,
        chunks: Sequence[ScheduledChunk],
        sampled: Mapping[str, int],
        accepted: Mapping[str, tuple[int, ...]],
    ) -> dict[str, tuple[int, ...]]:
        """Each request's drafts continuing the tokens this round emitted (its ``accepted``
        drafts, then its ``sampled`` token)."""
        ...

    def idle(self, moe: MoEBackend | None, low_latency: bool) -> None:
        """A round this rank has nothing to run: join any collective the drafter has."""
        ...

    def regroup(
        self, placement: ExpertPlacement, group: Any, source: Callable[[], TensorSource]
    ) -> None:
        """The group re-formed (elastic expert parallelism): re-home any experts it has."""
        ...


def build_drafter(
    config: RunnerConfig, model: CausalLM, source: TensorSource, placement: ExpertPlacement
) -> Drafter | None:
    """The drafter ``config.speculative`` asks for, on the model's device and dtype; None
    for ``ngram`` or no speculation."""
    spec = config.speculative
    if spec is None or spec.method == "ngram":
        return None
    weight = model.embed_tokens.weight
    if spec.method == "mtp":
        layer = build_next_n(config.model_config, source, placement, weight.dtype, weight.device)
        return NextNDrafter(layer, model)
    if spec.method == "draft_model" and spec.model is not None:
        draft = DraftModel.load(
            spec.model,
            config.model_config,
            dtype=weight.dtype,
            device=weight.device,
            seed=config.seed,
            target_model=config.model,
            gguf_weights=config.gguf_weights,
            # Room for this rank's running requests and as many finishing ones: rows past
            # it go least recently used first (a finished request is never used again).
            max_requests=2 * config.max_batch_size,
            max_len=config.max_model_len,
            # A new request's prompt is caught up over a few rounds rather than stalling one
            # (a draft's prefill of a long prompt costs as much as a chunk of the target's).
            max_prefill_tokens=DRAFT_CATCH_UP_TOKENS,
        )
        return DraftModelDrafter(draft, spec.k)
    raise ValueError(f"speculative_config.method {spec.method}: no drafter on this rank")


class DraftModelDrafter:
    """``draft_model``: each request's history after the round, continued by the draft
    model's ``k`` greedy tokens (it catches up on the tokens it has not seen itself)."""

    needs_hidden = False

    def __init__(self, draft: DraftModel, k: int) -> None:
        self.model = draft
        self.k = k

    def hold(self, ctx: ForwardContext, hidden: torch.Tensor) -> None:
        """Not needed: the draft model reads tokens, not the target's states."""

    def draft(
        self,
        chunks: Sequence[ScheduledChunk],
        sampled: Mapping[str, int],
        accepted: Mapping[str, tuple[int, ...]],
    ) -> dict[str, tuple[int, ...]]:
        histories: dict[str, list[int]] = {}
        for chunk in chunks:
            req = chunk.request
            token = sampled.get(req.request_id)
            # No drafts for a grammar request (``Speculator``) nor one that sampled nothing.
            if token is None or req.sampling.grammar is not None:
                continue
            kept = accepted.get(req.request_id, ())
            histories[req.request_id] = [*req.token_ids(0, req.num_tokens), *kept, token]
        if not histories:
            return {}
        try:
            drafts = self.model.propose(histories, dict.fromkeys(histories, self.k))
        except Exception:  # drafts are optional: the round's tokens stand without them
            logger.exception("the draft model failed; no drafts next round")
            return {}
        return {rid: d for rid, d in drafts.items() if d}

    def idle(self, moe: MoEBackend | None, low_latency: bool) -> None:
        """A dense draft has no collective: an idle rank runs nothing."""

    def regroup(
        self, placement: ExpertPlacement, group: Any, source: Callable[[], TensorSource]
    ) -> None:
        """No experts to re-home."""
