"""``roundgate calibrate``: write a ``--costs`` file from an nccl-tests log and/or a scrape."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from roundgate.sim.calibration import calibrate
from roundgate.sim.round_costs import PRESETS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="a --costs file from an nccl-tests all_gather_perf log and/or a metrics scrape",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--nccl-log", type=Path, default=None, help="all_gather_perf output")
    p.add_argument(
        "--metrics",
        type=Path,
        action="append",
        default=None,
        help="Prometheus text scrape of the engine (repeat: one per run; several runs of "
        "different loads fit per-sequence and per-prompt-token costs)",
    )
    p.add_argument(
        "--metrics-baseline",
        type=Path,
        action="append",
        default=None,
        help="a scrape taken before the run of the --metrics at the same position; its rounds "
        "are subtracted (roundgate bench --metrics-dir writes both)",
    )
    p.add_argument("--dp-size", type=int, default=8)
    p.add_argument("--policy", default="roundgate", help="sizes the gathered row")
    p.add_argument("--base", default="toy", help=f"preset for unset fields ({', '.join(PRESETS)})")
    p.add_argument("--out", type=Path, default=None, help="write here (default: stdout)")
    p.set_defaults(func=run, parser=p)


def run(ns: argparse.Namespace) -> int:
    try:
        out = calibrate(
            ns.dp_size, ns.policy, ns.base, ns.nccl_log, ns.metrics or (), ns.metrics_baseline or ()
        )
    except ValueError as exc:
        ns.parser.error(str(exc))
    text = json.dumps(out, indent=2, sort_keys=True) + "\n"
    if ns.out is None:
        print(text, end="")
    else:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(text)
        print(f"wrote {ns.out}")
    return 0
