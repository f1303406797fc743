"""What one group round meant for the gate and for the regime, read from its vote and rows.

The live metrics (``actors/telemetry/rank_metrics.py``) and the simulator's regime report
(``sim/regime_report.py``) classify rounds with these functions, so a scrape of a serving group
and a simulated report of the same workload count the same things:

- the gate's **outcome** in a round (``gate_outcome``): held while someone wanted prefill,
  opened and ran prefill (labelled by the vote's reason or attempt point), opened with nothing
  to run, or nothing to decide;
- **mixed** rounds (``is_mixed``): some rank extends while another busy rank only decodes and
  waits for its chunk (SGLang #35241's LOW regime stays in them);
- **prefill progress** (``ProgressBins``): each rank's prompt tokens in fixed time bins, and
  how far the ranks drift apart within a bin (most minus fewest tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from roundgate.gate.rows import RankRow
from roundgate.gate.vote import GateVote

# #35241's ranks split "within ~5 s": the bin the progress spread is taken over.
PROGRESS_BIN_S = 5.0

CLOSED = "closed"  # the vote held while some rank wanted prefill; nobody extended
EMPTY = "empty"  # the vote opened for a rank that wanted prefill, yet nobody extended
# The vote held, yet some rank extended: resident chunks let through a hold (SGLang's DELAY),
# or a per-rank policy that opened on another rank than the one whose vote is read.
PARTIAL = "partial"
NO_DEMAND = "no_demand"  # nobody wanted prefill and nobody extended: nothing to decide
OPEN = "open"  # an opening vote with neither a reason nor an attempt point
# Outcomes every policy can produce; an opening that ran is also labelled by its vote's
# ``reason`` or ``point`` ("all", "any", a peer's reason such as "no_wait").
OUTCOMES = (CLOSED, "all", "any", OPEN, EMPTY, PARTIAL, NO_DEMAND)


def opening(vote: GateVote) -> str:
    """The label of an open vote whose round ran prefill: its reason, else its point."""
    return vote.reason or vote.point or OPEN


def gate_outcome(vote: GateVote, wanted: bool, any_extend: bool) -> str:
    """The gate's outcome in one group round.

    ``wanted``: some rank wanted prefill in the rows the vote read (last round's gather);
    ``any_extend``: some rank extended in this round's gather.

    >>> gate_outcome(GateVote(True, "all"), wanted=False, any_extend=True)
    'all'

    | vote   | wanted | some rank extended | outcome                         |
    | ------ | ------ | ------------------ | ------------------------------- |
    | open   | any    | yes                | ``opening(vote)``               |
    | open   | yes    | no                 | ``empty``                       |
    | closed | any    | yes                | ``partial``                     |
    | closed | yes    | no                 | ``closed``                      |
    | any    | no     | no                 | ``no_demand``                   |

    An open vote that ran prefill counts whether or not last round's rows wanted it: a prompt
    reaching an idle group is admitted at the ALL point the idle rows make.
    """
    if any_extend:
        return opening(vote) if vote.open else PARTIAL
    if not wanted:
        return NO_DEMAND
    return EMPTY if vote.open else CLOSED


def any_wants(rows: Sequence[RankRow]) -> bool:
    """Some rank published ``wants_prefill``."""
    return any(row.wants_prefill for row in rows)


def rank_kinds(rows: Sequence[RankRow]) -> tuple[int, int]:
    """``(extending, decoding)``: ranks that extend, and busy ranks that only decode (a
    rank's ``RoundKind`` is PREFILL or MIXED, and DECODE; IDLE ranks are neither)."""
    extending = decoding = 0
    for row in rows:
        if row.num_extends:
            extending += 1
        elif row.batch_size:
            decoding += 1
    return extending, decoding


def is_mixed(extending: int, decoding: int) -> bool:
    """A mixed round: some rank extends while another busy rank only decodes."""
    return extending > 0 and decoding > 0


def prefill_tokens(row: RankRow) -> int:
    """Prompt tokens the rank extended: its tokens less its decodes (one token each)."""
    return row.num_tokens - row.batch_size + row.num_extends


class ProgressBins:
    """Each rank's prompt tokens in consecutive ``bin_s`` bins of a clock, and the spread
    (most minus fewest tokens a rank prefilled) of every bin in which some rank prefilled.

    Rounds are added in clock order; a bin closes when a round falls past it (or ``close``).
    ``mean_spread`` is the mean over those active bins, the simulator's figure; ``last_spread``
    the spread of the bin closed last (0 when nobody prefilled in it), the live gauge's.
    """

    def __init__(self, num_ranks: int, bin_s: float = PROGRESS_BIN_S) -> None:
        if num_ranks < 1:
            raise ValueError(f"ProgressBins needs num_ranks >= 1, got {num_ranks}")
        if not bin_s > 0:
            raise ValueError(f"ProgressBins needs bin_s > 0, got {bin_s}")
        self.bin_s = bin_s
        self.tokens = [0] * num_ranks  # the open bin's tokens per rank
        self.bin: int | None = None  # the open bin's index (clock // bin_s)
        self.active = False  # some rank prefilled in the open bin
        self.active_bins = 0
        self.spread_sum = 0
        self.last_spread = 0

    def roll(self, t_s: float) -> bool:
        """Move to the bin of clock ``t_s``, closing the open one if ``t_s`` is past it;
        True when a bin closed."""
        b = int(t_s // self.bin_s)
        if b == self.bin:
            return False
        prev = self.bin
        self.bin = b
        if prev is None:
            return False
        self.close()
        if b > prev + 1:  # the bins in between saw no round: nobody prefilled in them
            self.last_spread = 0
        return True

    def add(self, t_s: float, tokens: Sequence[int]) -> None:
        """One round at clock ``t_s`` in which the ranks prefilled ``tokens`` (one per rank)."""
        self.roll(t_s)
        mine = self.tokens
        for rank, n in enumerate(tokens):
            if n:
                mine[rank] += n
                self.active = True

    def close(self) -> None:
        """Close the open bin: count its spread if some rank prefilled in it."""
        tokens = self.tokens
        if self.active:
            spread = max(tokens) - min(tokens)
            self.active_bins += 1
            self.spread_sum += spread
            self.last_spread = spread
        else:
            self.last_spread = 0
        self.tokens = [0] * len(tokens)
        self.active = False

    @property
    def mean_spread(self) -> float:
        """Mean spread in tokens over the closed bins in which some rank prefilled."""
        return self.spread_sum / self.active_bins if self.active_bins else 0.0
