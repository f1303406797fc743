"""Which drafts a decoding request verifies this round, and what verification kept.

The planner asks ``drafts_for`` for every decoding request; the scheduler reports each
verification back (``verified``). Drafts come from prompt lookup (``ngram``, here) or from a
model the rank ran after the last round (``mtp``, ``draft_model``: ``Request.proposed_drafts``,
taken for one round only). Drafts are capped so a verification never runs past what
the request may still emit: at most ``max_tokens - emitted - 1`` (a verification emits the
kept drafts plus one token), and never a position past the context. A request with a
grammar decodes without drafts: its matcher advances one token at a time and is not rolled
back here (vLLM checks drafts against the grammar's mask; that is future work).

Drafts that verification keeps cost little; drafts it rejects cost a verify forward over
tokens that yield nothing, which on a rank whose forward time grows with its tokens (a CPU,
a large batch on a GPU) makes decoding slower than without drafts. So each request paces its
own drafts:

- **how many**: a verification carries at most one draft more than the last one kept (all
  kept: one more, up to ``k``; some rejected: the kept count plus one), so a request wastes
  at most about one draft token per verification beyond those it keeps;
- **how often**: a request whose verification kept none of its drafts decodes without drafts
  for a while, twice as long after each such miss in a row (1, 2, 4 ... up to
  ``MAX_PAUSE_ROUNDS`` rounds), and from its next kept draft drafts every round again.

Text with nothing to copy soon stops paying for lookups; a copied passage is picked up
within a few rounds and reaches ``k`` drafts a verification after ``k`` full ones.

Under attention DP ``k`` is the group's: every rank caps at the same ``k`` and verifies in
the round's one forward (a verify chunk is a decode chunk of ``1 + drafts`` tokens), so no
rank runs an extra forward and the MoE collectives stay in lockstep.

Pure: no torch, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from roundgate.actors.control.ngram_drafts import NgramIndex
from roundgate.actors.control.request import Request
from roundgate.actors.control.speculative_config import SpeculativeConfig

# The longest run of draft-free rounds after misses in a row: ~1.5 % of rounds spent on
# rejected drafts, where nothing is ever kept.
MAX_PAUSE_ROUNDS = 64


@dataclass(slots=True)
class SpecStats:
    """Totals since the rank started (the metrics export their increase)."""

    verifies: int = 0  # decode chunks that carried at least one draft
    drafts: int = 0  # drafts verified
    accepted: int = 0  # drafts kept

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafts if self.drafts else 0.0

    @property
    def mean_accepted(self) -> float:
        """Tokens a verification yields on average: the kept drafts plus its own one."""
        return 1 + self.accepted / self.verifies if self.verifies else 1.0


class Speculator:
    """One rank's draft source and its acceptance counts."""

    def __init__(
        self, config: SpeculativeConfig, max_model_len: int | None, backoff: bool = True
    ) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.backoff = backoff  # each request paces its own drafts (the module doc)
        self.stats = SpecStats()

    def drafts_for(self, req: Request, room: int) -> tuple[int, ...]:
        """Up to ``min(k, room)`` drafts for ``req``'s next round (``room``: tokens the
        round's budget has left beyond its one decode token); ``()`` for none."""
        sampling = req.sampling
        # A model's proposal is for this round only: taken whether or not it is verified.
        proposed, req.proposed_drafts = req.proposed_drafts, ()
        if sampling.grammar is not None:
            return ()
        if req.draft_pause:
            req.draft_pause -= 1
            return ()
        emitted = len(req.output_token_ids) + req.num_resumed_tokens
        limit = min(req.draft_cap or self.config.k, room, sampling.max_tokens - emitted - 1)
        if self.max_model_len is not None:
            limit = min(limit, self.max_model_len - req.num_tokens)
        if limit <= 0:
            return ()
        if self.config.method != "ngram":
            return proposed[:limit]
        return self.propose(req, limit)

    def propose(self, req: Request, limit: int) -> tuple[int, ...]:
        """At most ``limit`` drafts continuing ``req`` by prompt lookup over its history, from
        the request's index (grown by the tokens it gained since its last lookup)."""
        index = req.draft_index
        if index is None:
            config = self.config
            index = req.draft_index = NgramIndex(config.prompt_lookup_min, config.prompt_lookup_max)
            index.extend(req.prompt_token_ids)
        seen = len(index.tokens) - req.num_prompt_tokens
        output = req.output_token_ids
        if seen < len(output):
            index.extend(output[seen:])
        return index.propose(limit)

    def verified(self, req: Request, num_drafts: int, num_accepted: int) -> None:
        """``req``'s verification kept ``num_accepted`` of its ``num_drafts`` drafts."""
        if not num_drafts:
            return
        stats = self.stats
        stats.verifies += 1
        stats.drafts += num_drafts
        stats.accepted += num_accepted
        if self.backoff:
            k = self.config.k
            cap = req.draft_cap or k
            req.draft_cap = min(k, cap + 1) if num_accepted == num_drafts else num_accepted + 1
        if num_accepted:
            req.draft_misses = 0
        elif self.backoff:
            req.draft_pause = min(1 << req.draft_misses, MAX_PAUSE_ROUNDS)
            req.draft_misses = min(req.draft_misses + 1, MAX_PAUSE_ROUNDS.bit_length())
