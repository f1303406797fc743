"""``roundgate tune``: search the gate's two intervals for the best goodput under an SLO.

Every candidate ``(attempt_interval, any_interval)`` with ``any >= attempt`` runs the same
seeded workload in the simulator. A request is *good* when its TTFT and its mean inter-token
latency (TPOT) both meet the SLO; goodput is good requests per simulated second (DistServe's
definition). The best pair is printed with a runner-up table and the ``none`` baseline.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from sim.cli import add_common_args
from sim.options import sim_specs
from sim.records import SimResult
from sim.report import summarize
from sim.spec import SimSpec, simulate


@dataclass(frozen=True)
class Candidate:
    """One searched setting and what it achieved."""

    attempt_interval: int | None
    any_interval: int | None
    goodput_rps: float
    good_fraction: float
    ttft_p99_ms: float | None
    itl_p99_ms: float | None
    output_tokens_per_s: float

    @property
    def label(self) -> str:
        if self.attempt_interval is None:
            return "none"
        return f"roundgate {self.attempt_interval}/{self.any_interval}"


def goodput(result: SimResult, ttft_slo_ms: float, itl_slo_ms: float) -> tuple[float, float]:
    """(good requests per second, fraction of requests that were good)."""
    good = 0
    for rec in result.records:
        if rec.finish_s is None or rec.first_token_s is None:
            continue
        ttft = (rec.first_token_s - rec.arrival_s) * 1000
        tpot = 0.0
        if rec.num_output > 1 and rec.last_token_s is not None:
            tpot = (rec.last_token_s - rec.first_token_s) * 1000 / (rec.num_output - 1)
        good += ttft <= ttft_slo_ms and tpot <= itl_slo_ms
    total = max(1, len(result.records))
    return (good / result.duration_s if result.duration_s else 0.0), good / total


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"{flag}: expected integers like 1,2,4, got {text!r}") from None
    if not values or values[0] < 1:
        raise ValueError(f"{flag}: expected integers >= 1, got {text!r}")
    return values


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="search the gate intervals for the best goodput under a TTFT/ITL SLO",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_common_args(p)
    g = p.add_argument_group("search")
    g.add_argument("--ttft-slo-ms", type=float, default=2000.0, help="TTFT bound of a request")
    g.add_argument("--itl-slo-ms", type=float, default=100.0, help="bound of its mean ITL")
    g.add_argument("--attempt-intervals", default="1,2,4,8", help="ALL-point spacings to try")
    g.add_argument("--any-intervals", default="4,8,16,32,64", help="ANY-point spacings to try")
    g.add_argument("--top", type=int, default=8, help="rows of the runner-up table")
    g.add_argument("--json", type=Path, default=None, help="write every candidate here")
    p.set_defaults(func=run, parser=p, num_requests=300, compare=None, policy="none")


def candidates(attempt_intervals: str, any_intervals: str) -> list[tuple[int, int]]:
    """The (attempt, any) grid, any >= attempt (the gate refuses the rest)."""
    attempts = _ints(attempt_intervals, "--attempt-intervals")
    anys = _ints(any_intervals, "--any-intervals")
    pairs = [(a, b) for a in attempts for b in anys if b >= a]
    if not pairs:
        raise ValueError(
            "--any-intervals: no value is >= any of --attempt-intervals, nothing to search"
        )
    return pairs


def search(
    base: SimSpec, pairs: list[tuple[int, int]], ttft_slo_ms: float, itl_slo_ms: float
) -> tuple[Candidate, list[Candidate]]:
    """``base`` (the ``none`` run) measured, and the gate at every pair, best goodput first
    (ties: the lower TTFT p99, then the smaller intervals)."""
    baseline = _measure(simulate(base), ttft_slo_ms, itl_slo_ms, None)
    found = []
    for attempt, any_ in pairs:
        given = {"prefill_attempt_interval": attempt, "prefill_any_attempt_interval": any_}
        result = simulate(base.with_policy("roundgate", given))
        found.append(_measure(result, ttft_slo_ms, itl_slo_ms, (attempt, any_)))
    found.sort(key=lambda c: (-c.goodput_rps, c.ttft_p99_ms or 0.0, c.attempt_interval))
    return baseline, found


def _measure(
    result: SimResult, ttft_slo_ms: float, itl_slo_ms: float, pair: tuple[int, int] | None
) -> Candidate:
    summary = summarize(result)
    rps, fraction = goodput(result, ttft_slo_ms, itl_slo_ms)
    return Candidate(
        pair[0] if pair else None,
        pair[1] if pair else None,
        round(rps, 4),
        round(fraction, 4),
        summary["ttft_ms"]["p99"],
        summary["itl_ms"]["p99"],
        summary["output_tokens_per_s"],
    )


def run(ns: argparse.Namespace) -> int:
    try:
        for flag, value in (("--ttft-slo-ms", ns.ttft_slo_ms), ("--itl-slo-ms", ns.itl_slo_ms)):
            if not value > 0:
                raise ValueError(f"{flag} must be > 0, got {value}")
        if ns.top < 1:
            raise ValueError(f"--top must be >= 1, got {ns.top}")
        (base,) = sim_specs(ns)  # the ``none`` run (tune's --policy default)
        pairs = candidates(ns.attempt_intervals, ns.any_intervals)
    except ValueError as exc:
        ns.parser.error(str(exc))
    baseline, found = search(base, pairs, ns.ttft_slo_ms, ns.itl_slo_ms)
    best = found[0]
    print(
        f"recommended: --prefill-attempt-interval {best.attempt_interval} "
        f"--prefill-any-attempt-interval {best.any_interval}  (goodput {best.goodput_rps:.3f} "
        f"req/s, {best.good_fraction:.1%} of requests within TTFT <= {ns.ttft_slo_ms:g} ms "
        f"and mean ITL <= {ns.itl_slo_ms:g} ms; none: {baseline.goodput_rps:.3f} req/s)"
    )
    print(format_candidates([*found[: ns.top], baseline]))
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "slo": {"ttft_ms": ns.ttft_slo_ms, "itl_ms": ns.itl_slo_ms},
            "recommended": asdict(best),
            "baseline_none": asdict(baseline),
            "candidates": [asdict(c) for c in found],
        }
        ns.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


def format_candidates(rows: list[Candidate]) -> str:
    """A fixed-width table of candidates."""
    header = ["setting", "goodput req/s", "good %", "TTFT p99 ms", "ITL p99 ms", "out tok/s"]
    lines = [header]
    for c in rows:
        lines.append(
            [
                c.label,
                f"{c.goodput_rps:.3f}",
                f"{c.good_fraction:.1%}",
                "-" if c.ttft_p99_ms is None else f"{c.ttft_p99_ms:.1f}",
                "-" if c.itl_p99_ms is None else f"{c.itl_p99_ms:.2f}",
                f"{c.output_tokens_per_s:.0f}",
            ]
        )
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines)
