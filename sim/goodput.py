"""Goodput, the figure of merit: requests per second that meet both a TTFT and an ITL-p99 SLO.

One latency number hides the trade a prefill policy makes (it buys inter-token latency with
time to first token); goodput (DistServe's definition, with the ITL tail in place of the mean
TPOT) counts only the requests a user would call served well, so a policy cannot win it by
starving one side. A request is *good* when it finished, its TTFT is within ``ttft_ms`` and
its ITL p99 is within ``itl_ms``.

The ITL p99 of a request is judged without keeping its gaps: the simulator counts, as the
tokens come, each request's gaps above the ITL SLO (``RequestRecord.slow_gaps``), and with
``m`` gaps the nearest-rank p99 (the ``ceil(0.99 m)``-th smallest gap) is within the SLO
exactly when at most ``m // 100`` gaps exceed it. A request with one output token has no gap
and meets any ITL SLO. ``roundgate bench`` judges its live requests by the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from roundgate.sim.records import SimResult

# Defaults of --slo-ttft-ms and --slo-itl-ms: an interactive chat's first token within 2 s and
# its stream without stalls a reader notices (a 200 ms gap is ~5 tokens/s). A regime scenario
# states its own (sim/regimes.py): a 40k-token prompt cannot meet 2 s on any policy.
DEFAULT_TTFT_SLO_MS = 2000.0
DEFAULT_ITL_SLO_MS = 200.0


@dataclass(frozen=True)
class Slo:
    """The two bounds a good request meets."""

    ttft_ms: float = DEFAULT_TTFT_SLO_MS
    itl_ms: float = DEFAULT_ITL_SLO_MS  # bound on the request's own ITL p99

    def __post_init__(self) -> None:
        for flag, value in (("--slo-ttft-ms", self.ttft_ms), ("--slo-itl-ms", self.itl_ms)):
            if not value > 0:  # also refuses NaN
                raise ValueError(f"{flag} must be > 0, got {value}")

    def describe(self) -> str:
        return f"TTFT <= {self.ttft_ms:g} ms and ITL p99 <= {self.itl_ms:g} ms"


def meets_itl_p99(slow_gaps: int, num_gaps: int) -> bool:
    """Whether a request whose ``num_gaps`` inter-token gaps include ``slow_gaps`` above the
    SLO has its nearest-rank ITL p99 within the SLO (at most 1 % of its gaps above it)."""
    return slow_gaps <= num_gaps // 100


def count_slow(gaps_ms: Iterable[float], itl_ms: float) -> int:
    """Gaps above ``itl_ms`` (a live client's measured gaps, judged as the simulator's)."""
    return sum(1 for gap in gaps_ms if gap > itl_ms)


@dataclass(frozen=True)
class Goodput:
    """One run's goodput under ``slo``."""

    slo: Slo
    requests_per_s: float
    good: int  # requests that met both bounds
    requests: int  # all requests sent (unfinished ones are not good)

    @property
    def fraction(self) -> float:
        return self.good / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with the fraction and the SLO it was measured against."""
        return {
            "slo": asdict(self.slo),
            "goodput_requests_per_s": round(self.requests_per_s, 4),
            "good_requests": self.good,
            "requests": self.requests,
            "good_fraction": round(self.fraction, 4),
        }


def goodput(result: SimResult, slo: Slo) -> Goodput:
    """Good requests of ``result`` per simulated second under ``slo``; ``result`` must have
    counted its slow gaps against ``slo.itl_ms`` (``SimSpec.itl_slo_ms``)."""
    if result.itl_slo_ms != slo.itl_ms:
        raise ValueError(
            f"--slo-itl-ms {slo.itl_ms:g}: the run counted its slow gaps against "
            f"{result.itl_slo_ms:g} ms (set SimSpec.itl_slo_ms to the SLO)"
        )
    good = 0
    for rec in result.records:
        if rec.finish_s is None or rec.first_token_s is None:
            continue
        ttft_ms = (rec.first_token_s - rec.arrival_s) * 1000.0
        if ttft_ms <= slo.ttft_ms and meets_itl_p99(rec.slow_gaps, max(0, rec.num_output - 1)):
            good += 1
    rate = good / result.duration_s if result.duration_s else 0.0
    return Goodput(slo, rate, good, len(result.records))


def format_goodputs(goodputs: Mapping[str, Goodput], baseline: str | None = "none") -> str:
    """One line per run: goodput, the good fraction and, with ``baseline`` among them, the
    ratio to its goodput."""
    if not goodputs:
        return ""
    slo = next(iter(goodputs.values())).slo
    base = goodputs.get(baseline) if baseline is not None else None
    rows = [("policy", "goodput req/s", "good %", f"vs {baseline}" if base else "")]
    for name, g in goodputs.items():
        ratio = ""
        if base is not None and g is not base and base.requests_per_s:
            ratio = f"{g.requests_per_s / base.requests_per_s:.2f}x"
        rows.append((name, f"{g.requests_per_s:.3f}", f"{g.fraction:.1%}", ratio))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return f"goodput ({slo.describe()}):\n" + "\n".join(lines)
