"""A held-out replay of vLLM PR #44558: fit the preset's fitted terms on one arm, predict the other.

    PYTHONPATH=. .venv/bin/python benchmarks/held_out_44558.py \
        [--json docs/results/held_out_44558.json] [--num-requests 3000]

``gb200-dsv3`` was fitted to both arms of workload A at once. Here each direction refits the
terms that were fitted (docs/cost-model.md section 5), on one arm's figures only, one term
per figure, by bisection; everything sourced or derived stays as it is:

- **fit on interval 2, predict interval 1**: ``decode_base_ms`` to interval 2's P50 ITL,
  ``extend_overhead_ms`` to its mean ITL, ``gc_pause_per_request_ms`` to its P99 TTFT;
- **fit on interval 1, predict interval 2**: ``decode_base_ms`` set to 25 ms, the middle of an
  assumed 20-30 ms Blackwell decode round (interval 1 has almost no decode-only round to fit
  it on; the range has no published source in docs/calibration.md), ``extend_overhead_ms``
  to interval 1's P50 ITL, ``gc_pause_per_request_ms`` to its P99 TTFT.

The collection period (600 requests) is held in both: one arm has one tail figure, which
cannot fit two terms. The other arm's six figures are then predicted and printed with their
errors; nothing of that arm entered the fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

from roundgate.sim.round_costs import PRESETS, RoundCosts
from roundgate.sim.scenarios import SCENARIOS, figure_of, run_arm

SCENARIO = SCENARIOS["vllm-44558"]
ARMS = {arm.label: arm for arm in SCENARIO.arms}
# (fit arm, predicted arm, terms fitted in order: (term, figure), terms set from a source)
DIRECTIONS = {
    "fit interval 2, predict interval 1": (
        "interval 2",
        "interval 1",
        (
            ("decode_base_ms", "itl_p50_ms", (15.0, 40.0)),
            ("extend_overhead_ms", "itl_mean_ms", (50.0, 400.0)),
            ("gc_pause_per_request_ms", "ttft_p99_ms", (0.0, 40.0)),
        ),
        {},
    ),
    "fit interval 1, predict interval 2": (
        "interval 1",
        "interval 2",
        (
            ("extend_overhead_ms", "itl_p50_ms", (50.0, 400.0)),
            ("gc_pause_per_request_ms", "ttft_p99_ms", (0.0, 40.0)),
        ),
        {"decode_base_ms": 25.0},
    ),
}


def bisect(
    measure: Callable[[float], float], target: float, low: float, high: float, steps: int
) -> float:
    """The value in [low, high] whose (increasing) measure is nearest ``target``."""
    best, best_gap = low, float("inf")
    for _ in range(steps):
        mid = (low + high) / 2
        value = measure(mid)
        if abs(value - target) < best_gap:
            best, best_gap = mid, abs(value - target)
        low, high = (mid, high) if value < target else (low, mid)
    return round(best, 3)


def held_out(name: str, num_requests: int, steps: int) -> dict:
    fit_label, predict_label, fitted, sourced = DIRECTIONS[name]
    costs: RoundCosts = dataclasses.replace(PRESETS[SCENARIO.costs], **sourced)
    fit_arm = ARMS[fit_label]
    for term, figure, (low, high) in fitted:

        def measure(
            value: float, term: str = term, figure: str = figure, base: RoundCosts = costs
        ) -> float:
            trial = dataclasses.replace(base, **{term: value})
            return figure_of(run_arm(SCENARIO, fit_arm, trial, num_requests), figure) or 0.0

        value = bisect(measure, fit_arm.published[figure], low, high, steps)
        costs = dataclasses.replace(costs, **{term: value})
    rows = []
    for label in (fit_label, predict_label):
        arm = ARMS[label]
        summary = run_arm(SCENARIO, arm, costs, num_requests)
        for figure, published in arm.published.items():
            simulated = figure_of(summary, figure)
            error = None if simulated is None else (simulated - published) / published
            rows.append(
                {
                    "arm": label,
                    "role": "fitted" if label == fit_label else "predicted",
                    "figure": figure,
                    "published": published,
                    "simulated": simulated,
                    "error": None if error is None else round(error, 4),
                }
            )
    terms = {term: getattr(costs, term) for term, _, _ in fitted} | sourced
    return {"fit_arm": fit_label, "predicted_arm": predict_label, "terms": terms, "rows": rows}


def markdown(directions: dict) -> str:
    """The docs' table (docs/cost-model.md section 5): each direction's predicted figures."""
    lines = [
        "| fitted on | terms refitted | predicted arm | figure | published | predicted | error |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in directions.values():
        terms = ", ".join(f"`{k}` {v:g}" for k, v in result["terms"].items())
        for r in result["rows"]:
            if r["role"] != "predicted":
                continue
            err = "-" if r["error"] is None else f"{r['error'] * 100:+.1f} %"
            lines.append(
                f"| {result['fit_arm']} | {terms} | {r['arm']} | {r['figure']} | "
                f"{r['published']:g} | {r['simulated']:.1f} | {err} |"
            )
            terms = ""
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-requests", type=int, default=3000)
    p.add_argument("--steps", type=int, default=8, help="bisection steps per term")
    p.add_argument("--json", type=Path, default=None)
    ns = p.parse_args(argv)
    out = {"command": sys.argv, "num_requests": ns.num_requests, "directions": {}}
    for name in DIRECTIONS:
        result = held_out(name, ns.num_requests, ns.steps)
        out["directions"][name] = result
        print(f"{name}: {json.dumps(result['terms'])}")
        for r in result["rows"]:
            err = "-" if r["error"] is None else f"{r['error'] * 100:+.1f} %"
            print(
                f"  {r['role']:<9} {r['arm']:<10} {r['figure']:<14} {r['published']:>8g} "
                f"{r['simulated']:>9.1f} {err:>8}"
            )
    print(markdown(out["directions"]))
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
