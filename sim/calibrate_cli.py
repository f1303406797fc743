"""``roundgate calibrate``: write a ``--costs`` file from an nccl-tests log and/or a scrape."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sim.calibration import gather_from_nccl
from sim.cost_fit import fit_round_costs, kind_totals
from sim.round_costs import PRESETS, load_costs


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


def _read(flag: str, path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot read ({exc.strerror})") from exc


def build(ns: argparse.Namespace) -> dict:
    if ns.nccl_log is None and ns.metrics is None:
        raise ValueError("give --nccl-log FILE and/or --metrics FILE")
    if ns.dp_size < 1:
        raise ValueError(f"--dp-size must be >= 1, got {ns.dp_size}")
    if ns.base not in PRESETS:
        raise ValueError(f"--base must be one of {', '.join(PRESETS)}, got {ns.base!r}")
    out: dict = {"base": ns.base}
    source: dict = {}
    if ns.nccl_log is not None:
        gather_ms, source["nccl"] = gather_from_nccl(
            _read("--nccl-log", ns.nccl_log), ns.dp_size, ns.policy
        )
        out["gather_ms"] = gather_ms
    if ns.metrics is not None:
        costs, source["metrics"] = fit_round_costs(_runs(ns.metrics, ns.metrics_baseline or []))
        out |= costs
    out["_source"] = source
    load_costs("calibrated", json.dumps(out))  # the file must load as --costs
    return out


def _runs(scrapes: list[Path], baselines: list[Path]) -> list[dict]:
    """Each run's per-kind totals, its baseline's subtracted."""
    if len(baselines) > len(scrapes):
        raise ValueError(
            f"--metrics-baseline given {len(baselines)} times for {len(scrapes)} --metrics"
        )
    runs = []
    for i, path in enumerate(scrapes):
        baseline = _read("--metrics-baseline", baselines[i]) if i < len(baselines) else None
        runs.append(kind_totals(_read("--metrics", path), baseline))
    return runs


def run(ns: argparse.Namespace) -> int:
    try:
        out = build(ns)
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
