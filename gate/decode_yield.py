"""What a decode round yields under speculative decoding, learned from the gathered rows.

With drafts, a decode round is a verify round: each decode feeds its last token plus its
drafts, and keeps the agreeing drafts plus one token. Two things the adaptive gate prices
then change, and both are read here from what every rank gathers alike:

- **Tokens a decode yields per round** (``tokens_per_decode``: kept drafts + 1). Every rank
  publishes its running total of kept drafts (the ``spec_accepted`` column, 0 without
  speculation); the group's total grows each round by what the previous round's
  verifications kept, and the decodes those verifications ran are the previous rows'
  ``batch_size - num_extends``. The yield is the ratio of the two running means, so a lag
  of a round or two (asynchronous scheduling) shifts samples without biasing the ratio.
- **Draft tokens in a row's ``num_tokens``**. A verify chunk counts ``1 + drafts`` tokens, so
  the old reading of a row's extend tokens (``num_tokens`` less one per decode) counts a
  decoding rank's drafts as prompt tokens. The drafts a decode carries are measured on
  decode-only rounds (``num_tokens - batch_size``) and taken off an extending rank's count.

A running total that goes down (a rank restarted, its counters with it) is a new baseline,
not a sample. Without speculation the yield stays 1 and the drafts 0: the gate's arithmetic
is exactly the one it had before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roundgate.gate.rows import RankRow

# Weight of a round's sample in the running means: the acceptance of a workload drifts over
# seconds (a copied passage, then free text), and one round's draws are noisy.
_EWMA = 0.05


@dataclass
class DecodeYield:
    """Running estimates of the tokens a decode yields per round and the drafts it carries."""

    # Running means per round of the group's kept drafts and of the decodes that kept them.
    _kept: float = 0.0
    _decodes: float = 0.0
    # Running means over decode-only rounds of drafts fed and of decodes.
    _fed: float = 0.0
    _fed_decodes: float = 0.0
    _last_total: int | None = None  # group total of kept drafts at the last round
    _last_decodes: int = 0  # decodes of the last round (the ones this round's total counts)

    def add_round(self, rows: Sequence[RankRow], accepted_total: int) -> None:
        """One gathered round: ``accepted_total`` the sum over ranks of their kept drafts."""
        decodes = sum(row.batch_size - row.num_extends for row in rows)
        last = self._last_total
        if last is not None and accepted_total >= last and self._last_decodes > 0:
            self._kept += _EWMA * (accepted_total - last - self._kept)
            self._decodes += _EWMA * (self._last_decodes - self._decodes)
        self._last_total = accepted_total
        self._last_decodes = decodes
        if decodes and not any(row.num_extends for row in rows):
            fed = sum(row.num_tokens - row.batch_size for row in rows)
            self._fed += _EWMA * (fed - self._fed)
            self._fed_decodes += _EWMA * (decodes - self._fed_decodes)

    @property
    def tokens_per_decode(self) -> float:
        """Tokens one decode yields per round: 1 plus the drafts it keeps on average."""
        return 1.0 + (self._kept / self._decodes if self._decodes > 0 else 0.0)

    @property
    def drafts_per_decode(self) -> float:
        """Draft tokens one decode feeds per round on average."""
        return self._fed / self._fed_decodes if self._fed_decodes > 0 else 0.0

    def extend_tokens(self, rows: Sequence[RankRow]) -> int:
        """The most prompt tokens any rank extends in the round: an extending rank's
        ``num_tokens`` less one token and the measured drafts per decode it runs beside."""
        per_decode = 1.0 + self.drafts_per_decode
        return max(
            (
                max(0, round(row.num_tokens - per_decode * (row.batch_size - row.num_extends)))
                for row in rows
                if row.num_extends
            ),
            default=0,
        )
