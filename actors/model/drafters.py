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

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from roundgate.actors.control.round import ScheduledChunk
from roundgate.actors.model.decoder import CausalLM
from roundgate.actors.model.layers import ForwardContext
from roundgate.actors.model.mtp import NextNDrafter, build_next_n
from roundgate.actors.model.runner_config import RunnerConfig
from roundgate.actors.model.weights import TensorSource
from roundgate.kernels.moe.base import MoEBackend
from roundgate.kernels.moe.placement import ExpertPlacement


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
    raise ValueError(f"speculative_config.method {spec.method}: no drafter on this rank")
