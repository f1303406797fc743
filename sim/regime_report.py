"""The regime report: did the group prefill in step (healthy) or stay "mixed" (LOW)?

SGLang #35241 shows one config landing in two regimes. Healthy: the ranks prefill in the same
rounds (the delayer at all/no_wait), so a decoding request on any rank waits for one aligned
window at a time. LOW: within seconds the ranks' prefill progress splits by whole chunks, some
rank is always mid-prompt, and the group stays "mixed": in nearly every round in which someone
extends, other ranks only decode and wait for its chunk. Request counts per rank stay even, so
a load imbalance does not show it; the round-by-round record does (``Timeline``):

- **mixed rounds**: rounds in which some rank extends while another busy rank only decodes
  (it runs one token in a round priced by the extend), among the rounds in which anyone
  extends; and the **aligned share**: in the mean extending round, the share of busy ranks
  that extend (1.0: every round with prefill has every busy rank prefilling);
- **window fill**: prompt tokens over what the extending rounds could have carried
  (``dp x --max-scheduled-tokens`` each): a group that pays for extend rounds with few ranks
  in them gets little prefill for them;
- **windows per second**: maximal runs of consecutive extending rounds (how often the group
  opens for prefill), and how long the mean one lasts: a group out of step never returns to
  plain decode rounds, so its windows run on for many chunk rounds;
- **per-rank prefill progress**: each rank's prompt tokens per second, and how far apart the
  ranks' progress drifts within 5 s bins, in chunks (``--max-scheduled-tokens``);
- **input tokens/s**: #35241's own figure.

The verdict is LOW when the group *stays* mixed: most extending rounds are mixed and the mean
window lasts longer than 5 s (#35241's runs split within ~5 s and then stay split). Either
alone does not decide: a gate's ANY points make mixed rounds by design (only the ranks with
prompts open) in short windows, and an aligned window of long prompts runs several chunk
rounds with every rank in it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from roundgate.actors.control.round import RoundKind
from roundgate.gate.outcome import PROGRESS_BIN_S, ProgressBins, is_mixed
from roundgate.sim.records import KIND_CODES, SimResult

# Per-rank round kinds as the timeline codes them.
_IDLE = KIND_CODES[RoundKind.IDLE]
_DECODE = KIND_CODES[RoundKind.DECODE]
# LOW: mixed rounds above this share of the extending rounds, in windows longer than
# LOW_WINDOW_S on average (the group stays mixed).
LOW_MIXED_FRACTION = 0.5
LOW_WINDOW_S = 5.0


@dataclass(frozen=True)
class RegimeReport:
    """One run's regime figures (from its timeline) and its verdict."""

    duration_s: float
    input_tokens_per_s: float
    extend_rounds: int  # rounds in which some rank extends
    mixed_rounds: int  # ... while another busy rank only decodes
    aligned_share: float  # mean over extending rounds of (extending / busy ranks)
    window_fill: float  # prompt tokens / (extending rounds x dp x chunk)
    windows: int  # maximal runs of consecutive extending rounds
    windows_per_s: float
    mean_window_s: float  # time in extending rounds per window
    rank_prefill_tokens_per_s: tuple[float, ...]
    # Mean over 5 s bins of (most - fewest prompt tokens a rank prefilled), in chunks.
    progress_spread_chunks: float

    @property
    def mixed_fraction(self) -> float:
        return self.mixed_rounds / self.extend_rounds if self.extend_rounds else 0.0

    @property
    def is_low(self) -> bool:
        """The group stayed "mixed": mostly mixed extending rounds, in long windows."""
        return self.mixed_fraction > LOW_MIXED_FRACTION and self.mean_window_s > LOW_WINDOW_S

    @property
    def verdict(self) -> str:
        return "LOW" if self.is_low else "healthy"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "mixed_fraction": round(self.mixed_fraction, 4),
            "verdict": self.verdict,
        }


def regime_report(result: SimResult, chunk_tokens: int) -> RegimeReport:
    """The report of ``result``, which must have kept its timeline (``keep_timeline``);
    ``chunk_tokens`` is the round's token budget (a chunk)."""
    tl = result.timeline
    if tl is None:
        raise ValueError("the regime report needs the run's timeline (SimSpec.keep_timeline)")
    if chunk_tokens < 1:
        raise ValueError(f"--max-scheduled-tokens must be >= 1, got {chunk_tokens}")
    dp = result.dp_size
    extend_rounds = mixed_rounds = windows = 0
    shares = extend_ms = 0.0
    was_extending = False
    per_rank = [0] * dp
    # The live metrics take the progress spread (and mixed rounds) the same way.
    progress = ProgressBins(dp, PROGRESS_BIN_S)
    for i, start in enumerate(tl.start_s):
        kinds = tl.kinds[i * dp : (i + 1) * dp]
        tokens = tl.prefill_tokens[i * dp : (i + 1) * dp]
        decoding = kinds.count(_DECODE)
        extending = dp - decoding - kinds.count(_IDLE)
        if extending:
            extend_rounds += 1
            mixed_rounds += is_mixed(extending, decoding)
            shares += extending / (extending + decoding)
            extend_ms += tl.duration_ms[i]
            windows += not was_extending
        was_extending = extending
        progress.add(start, tokens)
        for rank, n in enumerate(tokens):
            per_rank[rank] += n
    progress.close()
    duration = result.duration_s
    spread = progress.mean_spread
    return RegimeReport(
        duration_s=round(duration, 4),
        input_tokens_per_s=round(sum(per_rank) / duration, 1) if duration else 0.0,
        extend_rounds=extend_rounds,
        mixed_rounds=mixed_rounds,
        aligned_share=round(shares / extend_rounds, 4) if extend_rounds else 1.0,
        window_fill=round(sum(per_rank) / (extend_rounds * dp * chunk_tokens), 4)
        if extend_rounds
        else 0.0,
        windows=windows,
        windows_per_s=round(windows / duration, 4) if duration else 0.0,
        mean_window_s=round(extend_ms / 1000 / windows, 3) if windows else 0.0,
        rank_prefill_tokens_per_s=tuple(
            round(n / duration, 1) if duration else 0.0 for n in per_rank
        ),
        progress_spread_chunks=round(spread / chunk_tokens, 3),
    )


def format_reports(reports: dict[str, RegimeReport]) -> str:
    """One line per arm: the verdict and the figures behind it."""
    header = (
        "arm",
        "regime",
        "input tok/s",
        "mixed rounds",
        "aligned share",
        "window fill",
        "windows/s",
        "mean window s",
        "rank prefill tok/s min-max",
        "progress spread (chunks/5 s)",
    )
    rows = [header]
    for label, r in reports.items():
        rates = r.rank_prefill_tokens_per_s
        rows.append(
            (
                label,
                r.verdict,
                f"{r.input_tokens_per_s:,.0f}",
                f"{r.mixed_rounds}/{r.extend_rounds} ({r.mixed_fraction:.0%})",
                f"{r.aligned_share:.2f}",
                f"{r.window_fill:.2f}",
                f"{r.windows_per_s:.2f}",
                f"{r.mean_window_s:.1f}",
                f"{min(rates):,.0f}-{max(rates):,.0f}" if rates else "-",
                f"{r.progress_spread_chunks:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
