"""Does the simulator, priced from a live deployment, predict that deployment's own bench?

    .venv/bin/python benchmarks/close_the_loop.py --bench A.json [--bench B.json ...] \
        --metrics-dir DIR_A [--metrics-dir DIR_B ...] [--fit-from POLICY,...] \
        [--fit-bench A.json] \
        [--costs-out docs/results/costs_cpu_local.json] [--json docs/results/close_the_loop.json]

Each ``--bench`` is a ``roundgate bench --compare ... --metrics-dir DIR`` report. The costs are
fitted over the runs' scrapes (``--fit-from`` limits which policies' runs, ``--fit-bench``
which reports', i.e. which loads, so a prediction can be checked on runs the fit never saw),
each run is replayed in the simulator with them, and live vs simulated TTFT and ITL are
printed with the error of each (``roundgate.sim.live_check``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from roundgate.sim.live_check import TOLERANCE, predict


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", type=Path, action="append", required=True)
    p.add_argument("--metrics-dir", type=Path, action="append", required=True)
    p.add_argument(
        "--fit-from", default=None, help="policies whose runs the fit uses (default all)"
    )
    p.add_argument(
        "--fit-bench",
        default=None,
        help="bench reports (file names) whose runs the fit uses (default all): one load "
        "predicting another",
    )
    p.add_argument("--costs-out", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    ns = p.parse_args(argv)
    fit_from = set(ns.fit_from.split(",")) if ns.fit_from else None
    fit_benches = set(ns.fit_bench.split(",")) if ns.fit_bench else None
    costs_path = ns.costs_out or Path(tempfile.mkdtemp()) / "costs.json"
    try:
        costs, table = predict(ns.bench, ns.metrics_dir, fit_from, costs_path, fit_benches)
    except ValueError as exc:
        p.error(str(exc))
    print(f"wrote {costs_path}")
    print(json.dumps({k: v for k, v in costs.items() if k != "_source"}, sort_keys=True))
    print(f"{'run':<34} {'figure':<10} {'live':>9} {'sim':>9} {'error':>8}  fit saw it")
    for r in table:
        error = "-" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        miss = r["checked"] and r["error"] is not None and abs(r["error"]) > TOLERANCE
        live = "-" if r["live"] is None else f"{r['live']:.1f}"
        sim = "-" if r["simulated"] is None else f"{r['simulated']:.1f}"
        run = f"{r['bench']} {r['policy']}"
        seen = "yes" if r["fitted"] else "no (predicted)"
        mark = " <-" if miss else ""
        print(f"{run:<34} {r['figure']:<10} {live:>9} {sim:>9} {error:>8}  {seen}{mark}")
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"command": sys.argv, "costs": costs, "tolerance": TOLERANCE, "rows": table}
        ns.json.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
