"""``roundgate tune``: search the gate's two intervals for the best goodput under an SLO.

Every candidate ``(attempt_interval, any_interval)`` with ``any >= attempt`` runs the same
seeded workload in the simulator. A request is *good* when its TTFT and its own ITL p99 both
meet the SLO; goodput is good requests per simulated second (``roundgate.sim.goodput``). The best
pair is printed with a runner-up table and the ``none`` baseline, then each policy of ``--pareto``
with its TTFT-ITL Pareto front over its own parameter range (``roundgate.sim.pareto``): the gate's
from the same grid, the others' from runs of their own settings.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from roundgate.sim.cli import add_common_args, add_slo_args, slo_of
from roundgate.sim.goodput import Slo, goodput
from roundgate.sim.options import sim_specs
from roundgate.sim.pareto import Point, format_fronts, pareto_front, policies_of, settings
from roundgate.sim.records import SimResult
from roundgate.sim.report import summarize
from roundgate.sim.spec import SimSpec, simulate


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
    add_slo_args(g, ("ttft", "--ttft-slo-ms"), ("itl", "--itl-slo-ms"))
    g.add_argument("--attempt-intervals", default="1,2,4,8", help="ALL-point spacings to try")
    g.add_argument("--any-intervals", default="4,8,16,32,64", help="ANY-point spacings to try")
    g.add_argument("--top", type=int, default=8, help="rows of the runner-up table")
    g.add_argument(
        "--pareto",
        default="",
        help="policies whose TTFT-ITL Pareto front to print, each over its own parameter "
        "range (comma-separated, or 'all'); the gate's comes from the grid above (no runs)",
    )
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
    base: SimSpec, pairs: list[tuple[int, int]], slo: Slo
) -> tuple[Candidate, list[Candidate]]:
    """``base`` (the ``none`` run) measured, and the gate at every pair, best goodput first
    (ties: the lower TTFT p99, then the smaller intervals)."""
    base = replace(base, itl_slo_ms=slo.itl_ms)
    baseline = _measure(simulate(base), slo, None)
    found = []
    for attempt, any_ in pairs:
        given = {"prefill_attempt_interval": attempt, "prefill_any_attempt_interval": any_}
        result = simulate(base.with_policy("roundgate", given))
        found.append(_measure(result, slo, (attempt, any_)))
    found.sort(key=lambda c: (-c.goodput_rps, c.ttft_p99_ms or 0.0, c.attempt_interval))
    return baseline, found


def _measure(result: SimResult, slo: Slo, pair: tuple[int, int] | None) -> Candidate:
    summary = summarize(result)
    good = goodput(result, slo)
    return Candidate(
        pair[0] if pair else None,
        pair[1] if pair else None,
        round(good.requests_per_s, 4),
        round(good.fraction, 4),
        summary["ttft_ms"]["p99"],
        summary["itl_ms"]["p99"],
        summary["output_tokens_per_s"],
    )


def fronts(
    base: SimSpec,
    policies: list[str],
    pairs: list[tuple[int, int]],
    found: list[Candidate],
    slo: Slo,
) -> dict[str, list[Point]]:
    """Each policy's Pareto front over its own settings (``roundgate.sim.pareto``); the gate's pairs
    are the grid's runs (``found``), not run again."""
    base = replace(base, itl_slo_ms=slo.itl_ms)
    out = {}
    for policy in policies:
        points = []
        if policy == "roundgate":
            for c in found:
                setting = (("prefill_attempt_interval", c.attempt_interval),)
                setting += (("prefill_any_attempt_interval", c.any_interval),)
                points.append(_point(policy, setting, c.ttft_p99_ms, c.itl_p99_ms, c.goodput_rps))
        else:
            for given in settings(policy, pairs):
                result = simulate(base.with_policy(policy, given))
                summary = summarize(result)
                points.append(
                    _point(
                        policy,
                        tuple(given.items()),
                        summary["ttft_ms"]["p99"],
                        summary["itl_ms"]["p99"],
                        goodput(result, slo).requests_per_s,
                    )
                )
        out[policy] = pareto_front(p for p in points if p is not None)
    return out


def _point(
    policy: str,
    setting: tuple[tuple[str, Any], ...],
    ttft: float | None,
    itl: float | None,
    rps: float,
) -> Point | None:
    """A front's point; None for a run with no TTFT or no ITL sample (nothing to place)."""
    if ttft is None or itl is None:
        return None
    return Point(policy, setting, ttft, itl, round(rps, 4))


def run(ns: argparse.Namespace) -> int:
    try:
        for flag, value in (
            ("--slo-ttft-ms (--ttft-slo-ms)", ns.slo_ttft_ms),
            ("--slo-itl-ms (--itl-slo-ms)", ns.slo_itl_ms),
        ):
            if value is not None and not value > 0:
                raise ValueError(f"{flag} must be > 0, got {value}")
        slo = slo_of(ns)
        if ns.top < 1:
            raise ValueError(f"--top must be >= 1, got {ns.top}")
        (base,) = sim_specs(ns)  # the ``none`` run (tune's --policy default)
        pairs = candidates(ns.attempt_intervals, ns.any_intervals)
        pareto = policies_of(ns.pareto)
    except ValueError as exc:
        ns.parser.error(str(exc))
    baseline, found = search(base, pairs, slo)
    best = found[0]
    print(
        f"recommended: --prefill-attempt-interval {best.attempt_interval} "
        f"--prefill-any-attempt-interval {best.any_interval}  (goodput {best.goodput_rps:.3f} "
        f"req/s, {best.good_fraction:.1%} of requests within {slo.describe()}; "
        f"none: {baseline.goodput_rps:.3f} req/s)"
    )
    print(format_candidates([*found[: ns.top], baseline]))
    front = fronts(base, pareto, pairs, found, slo) if pareto else {}
    if front:
        print(format_fronts(front))
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "slo": {"ttft_ms": slo.ttft_ms, "itl_ms": slo.itl_ms, "itl_statistic": "p99"},
            "recommended": asdict(best),
            "baseline_none": asdict(baseline),
            "candidates": [asdict(c) for c in found],
            "pareto": {
                name: [asdict(p) | {"label": p.label} for p in points]
                for name, points in front.items()
            },
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
