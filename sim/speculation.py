"""Speculative decoding in the simulator: what a verify round costs and how many tokens it
yields, so the group's rounds, the gate and goodput see speculation as a live group would.

The live scheduler runs (``roundgate.actors.control.speculation``): every decoding request
carries ``k`` drafts in its decode chunk (capped, as live, by ``max_tokens`` and the round's
budget), and the cost executor keeps each draft with probability ``acceptance`` until the
first rejection (drafts are accepted left to right, each independently: the standard model
of speculative decoding, whose expected yield per verification is
``(1 - a^(k + 1)) / (1 - a)``). The rest is the live bookkeeping: kept drafts appended,
rejected drafts' pages given back.

A verification prices as decode work over every token it feeds (the last token plus its
drafts: ``decode_per_seq_ms`` a token), plus the drafts' own forwards where the method has
them: ``draft_share`` of the rank's decode forward per draft step (DeepSeek's MTP module is
one decoder layer of the model's 61, about 1/61; prompt lookup costs none).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roundgate.actors.control.request import Request
from roundgate.actors.control.speculation import Speculator
from roundgate.actors.control.speculative_config import (
    MAX_SPECULATIVE_TOKENS,
    SpeculativeConfig,
)

# The token every simulated draft proposes (the cost executor samples the same one).
SIM_DRAFT = 0


@dataclass(frozen=True)
class SpecSim:
    """``--spec-tokens`` drafts per decode, each kept with ``--spec-acceptance``, each draft
    step costing ``--spec-draft-share`` of a decode forward."""

    num_speculative_tokens: int
    acceptance: float
    draft_share: float = 0.0

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"--spec-tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")
        if not 0.0 <= self.acceptance < 1.0:
            raise ValueError(f"--spec-acceptance must be in [0, 1), got {self.acceptance!r}")
        if not 0.0 <= self.draft_share <= 1.0:
            raise ValueError(f"--spec-draft-share must be in [0, 1], got {self.draft_share!r}")

    @property
    def config(self) -> SpeculativeConfig:
        """The live scheduler's config (its drafts come from ``SimDrafts``)."""
        k = self.num_speculative_tokens
        return SpeculativeConfig(
            method="ngram", num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=1
        )

    def expected_tokens(self) -> float:
        """Tokens one verification of ``k`` drafts yields on average."""
        a, k = self.acceptance, self.num_speculative_tokens
        return (1 - a ** (k + 1)) / (1 - a)


class SimDrafts(Speculator):
    """Always ``k`` drafts (within the live caps): a simulated request has no text to look
    up, so the drafts' quality lives in the acceptance rate instead. Built without the live
    prompt lookup's back-off after misses: the drafts modelled here (MTP's) are drafted every
    round, as SGLang and vLLM run them."""

    def propose(self, req: Request, limit: int) -> tuple[int, ...]:
        return (SIM_DRAFT,) * limit


class Acceptance:
    """Seeded draws of how many of a verification's drafts are kept."""

    def __init__(self, spec: SpecSim, seed: int) -> None:
        self.spec = spec
        self.rng = random.Random(seed)

    def kept(self, num_drafts: int) -> int:
        a = self.spec.acceptance
        random_ = self.rng.random
        n = 0
        while n < num_drafts and random_() < a:
            n += 1
        return n


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """``--spec-tokens``, ``--spec-acceptance`` and ``--spec-draft-share``."""
    g = p.add_argument_group("speculative decoding (sim/speculation.py)")
    g.add_argument(
        "--spec-tokens",
        type=int,
        default=None,
        help="draft tokens verified with every decode (num_speculative_tokens); unset: none",
    )
    g.add_argument(
        "--spec-acceptance",
        type=float,
        default=0.7,
        help="chance each draft is kept, left to right until the first rejection",
    )
    g.add_argument(
        "--spec-draft-share",
        type=float,
        default=0.0,
        help="cost of one draft step as a share of a decode forward (MTP: about 1/61; "
        "prompt lookup: 0)",
    )


def spec_of(given: Mapping[str, Any]) -> SpecSim | None:
    """The parsed flags' ``SpecSim``, or None without ``--spec-tokens``."""
    k = given.get("spec_tokens")
    if k is None:
        return None
    return SpecSim(k, given.get("spec_acceptance", 0.7), given.get("spec_draft_share", 0.0))
